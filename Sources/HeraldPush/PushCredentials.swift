import Foundation
import HeraldCore
import HeraldPorts

/// A credential file that does not read or parse. Says which file and
/// why, never what it holds.
public struct PushCredentialError: Error, CustomStringConvertible {
    public let description: String
    init(_ d: String) { description = d }
}

/// An app's push credentials, read from the files its settings name.
struct LoadedCredentials {
    struct APNs {
        let settings: PushSettings.APNs
        let key: ES256Key
        /// Signing for development devices with the sandbox-only key, when there is one.
        let development: Development?

        struct Development {
            let keyId: String
            let key: ES256Key
        }

        /// These credentials as the development devices' sender signs with them.
        var forDevelopment: APNs? {
            development.map { d in
                var s = settings
                s.keyId = d.keyId
                return APNs(settings: s, key: d.key, development: nil)
            }
        }
    }

    /// A Google service account's JSON key file, the fields FCM's OAuth needs.
    struct ServiceAccount {
        let projectId: String
        let clientEmail: String
        let privateKeyId: String?
        let tokenURI: String
        let key: RS256Key
    }

    struct FCM {
        let settings: PushSettings.FCM
        let account: ServiceAccount
    }

    struct WebPush {
        let settings: PushSettings.WebPush
        let vapid: VAPID
    }

    let apns: APNs?
    let fcm: FCM?
    let webPush: WebPush?

    init(_ s: PushSettings) throws(PushCredentialError) {
        apns = try s.apns.map { a throws(PushCredentialError) in
            var development: APNs.Development? = nil
            if let id = a.developmentKeyId, let file = a.developmentKeyFile {
                development = APNs.Development(keyId: id, key: try Self.key("push.apns.developmentKeyFile", file) { try ES256Key(pem: $0) })
            }
            return APNs(settings: a, key: try Self.key("push.apns.keyFile", a.keyFile) { try ES256Key(pem: $0) }, development: development)
        }
        fcm = try s.fcm.map { f throws(PushCredentialError) in FCM(settings: f, account: try Self.serviceAccount(f.serviceAccountFile)) }
        webPush = try s.webPush.map { w throws(PushCredentialError) in
            WebPush(settings: w, vapid: VAPID(key: try Self.key("push.webpush.vapidPrivateKeyFile", w.vapidPrivateKeyFile) {
                try ES256Key(pemOrRaw: $0)
            }))
        }
    }

    private static func read(_ what: String, _ path: String) throws(PushCredentialError) -> String {
        guard let data = FileManager.default.contents(atPath: path) else { throw PushCredentialError("\(what) \(path) cannot be read") }
        return String(decoding: data, as: UTF8.self)
    }

    private static func key<K>(_ what: String, _ path: String, _ parse: (String) throws -> K) throws(PushCredentialError) -> K {
        let text = try read(what, path)
        do { return try parse(text) } catch {
            throw PushCredentialError("\(what) \(path) holds no usable key (\(error))")
        }
    }

    private static func serviceAccount(_ path: String) throws(PushCredentialError) -> ServiceAccount {
        let what = "push.fcm.serviceAccountFile"
        let text = try read(what, path)
        guard let o = (try? JSONParser.parse(text))?.objectValue else { throw PushCredentialError("\(what) \(path) is not a JSON object") }
        func field(_ k: String) throws(PushCredentialError) -> String {
            guard let v = o[k]?.stringValue, !v.isEmpty else { throw PushCredentialError("\(what) \(path) has no \(k)") }
            return v
        }
        let tokenURI = try field("token_uri")
        guard PushHandle.httpsOrigin(tokenURI) != nil else { throw PushCredentialError("\(what) \(path): token_uri must be https") }
        let pem = try field("private_key")
        let key: RS256Key
        do { key = try RS256Key(pem: pem) } catch { throw PushCredentialError("\(what) \(path): private_key is no usable RSA key (\(error))") }
        return ServiceAccount(projectId: try field("project_id"), clientEmail: try field("client_email"),
                              privateKeyId: o["private_key_id"]?.stringValue, tokenURI: tokenURI, key: key)
    }
}

/// The check the command line runs on each app's settings at start and at
/// each reload: every file reads and parses. Fills in the VAPID public key.
public enum PushCredentials {
    public static func check(_ settings: inout PushSettings) throws(PushCredentialError) {
        let loaded = try LoadedCredentials(settings)
        if let vapid = loaded.webPush?.vapid { settings.webPush?.publicKey = vapid.publicKey }
    }
}
