import Foundation
import HeraldCore
import HeraldPorts

/// An app's `webhooks` list in the config file (SPEC section 13,
/// docs/OPERATIONS.md "Webhooks"): `[{"url", "secret" or "secrets", "events"?, "caFile"?}]`.
/// Secrets are never quoted in what this refuses.
extension ConfigFile {
    static func webhooks(_ json: JSON, app id: String) throws(UsageError) -> [WebhookEndpoint] {
        guard let list = json.arrayValue else { throw UsageError("app \(id): webhooks must be an array") }
        var out: [WebhookEndpoint] = []
        for (i, e) in list.enumerated() {
            let what = "app \(id): webhooks[\(i)]"
            var f = try Section(e, what)
            let url = try f.required("url")
            guard Self.isWebhookURL(url) else { throw UsageError("\(what).url must be an http:// or https:// URL with a host") }
            guard !out.contains(where: { $0.url == url }) else { throw UsageError("\(what).url is listed twice") }
            let one = try f.string("secret"), many = try f.strings("secrets")
            guard (one == nil) != (many == nil || many!.isEmpty) else { throw UsageError("\(what) needs exactly one of secret and secrets (newest first)") }
            var keys: [[UInt8]] = []
            for s in one.map({ [$0] }) ?? many! {
                guard let key = WebhookEndpoint.key(ofSecret: s) else {
                    throw UsageError("\(what): a secret must be whsec_ and the base64 of 24 to 64 random bytes")
                }
                keys.append(key)
            }
            var events: Set<WebhookEventType>? = nil
            if let names = try f.strings("events") {
                events = []
                for n in names {
                    guard let t = WebhookEventType(rawValue: n) else {
                        throw UsageError("\(what).events: unknown event type \"\(n)\" (docs/PROTOCOL.md, \"Webhooks\")")
                    }
                    events!.insert(t)
                }
            }
            let caFile = try f.string("caFile")
            if let caFile, !FileManager.default.isReadableFile(atPath: caFile) { throw UsageError("\(what).caFile \(caFile) cannot be read") }
            try f.finish()
            out.append(WebhookEndpoint(url: url, secrets: keys, events: events, caFile: caFile))
        }
        return out
    }

    /// `http://` or `https://`, a host, and no spaces or control characters.
    static func isWebhookURL(_ s: String) -> Bool {
        let lower = s.lowercased()
        guard let rest = ["https://", "http://"].first(where: lower.hasPrefix).map({ lower.dropFirst($0.count) }),
              let host = rest.split(separator: "/", maxSplits: 1, omittingEmptySubsequences: false).first,
              !host.isEmpty, !host.hasPrefix(":"), !host.contains("@") else { return false }
        return s.utf8.allSatisfy { $0 > 0x20 && $0 < 0x7F }
    }
}
