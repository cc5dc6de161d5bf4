import Foundation
import HeraldCore

enum TokenScope {
    /// "app user" from a device token's claims (not verified: the gateway
    /// does that), or nil when it cannot be read. The state file is kept per
    /// gateway, app, user and device: a token for someone else starts from
    /// nothing.
    static func appAndUser(of token: String) -> String? {
        guard let claims = claims(of: token), let app = claims["app"]?.stringValue,
              let user = claims["sub"]?.stringValue else { return nil }
        return "\(app) \(user)"
    }

    /// The token's `exp` (seconds since 1970), unverified; nil when unreadable.
    static func expiry(of token: String) -> Int64? { claims(of: token)?["exp"]?.int64Value }

    private static func claims(of token: String) -> JSONObject? {
        let parts = token.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3 else { return nil }
        var b64 = parts[1].replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        b64 += String(repeating: "=", count: (4 - b64.count % 4) % 4)
        guard let data = Data(base64Encoded: b64) else { return nil }
        return try? JSONParser.parse([UInt8](data)).objectValue
    }
}
