/// The push services a device can be woken through (SPEC section 10).
public enum PushService: String, Sendable, CaseIterable { case apns, fcm, webpush }

public enum APNsEnvironment: String, Sendable, CaseIterable { case production, development }

/// A browser's push subscription (the Push API's `PushSubscription.toJSON()`).
public struct WebPushSubscription: Sendable, Equatable {
    public let endpoint: String
    /// The endpoint's host, lower-cased, and its port (nil: 443): what the
    /// app's allowed hosts judge.
    public let host: String
    public let port: Int?
    /// `scheme://host[:port]`: the VAPID `aud` (RFC 8292).
    public let origin: String
    /// The browser's P-256 public key, an uncompressed point (65 bytes).
    public let p256dh: [UInt8]
    /// The browser's authentication secret (16 bytes).
    public let auth: [UInt8]
}

/// One device's push handle. It belongs to one device of one app: `key`
/// names it there, so registering it for another device moves it.
public enum PushHandle: Sendable, Equatable {
    case apns(token: String, environment: APNsEnvironment)
    case fcm(token: String)
    /// Boxed: a handle is held inline by every registration and connection
    /// (`Device`, a hello's registration), and the subscription's 80 bytes
    /// would weigh on each of them, with or without push.
    indirect case webpush(WebPushSubscription)

    public var service: PushService {
        switch self {
        case .apns: .apns
        case .fcm: .fcm
        case .webpush: .webpush
        }
    }

    public var key: String {
        switch self {
        case .apns(let token, _): "apns:" + token
        case .fcm(let token): "fcm:" + token
        // Scheme and host lower-cased: one endpoint, one key, however it is spelled.
        case .webpush(let s): "webpush:" + s.origin + s.endpoint.dropFirst(s.origin.count)
        }
    }

    /// The full form: what a device registers and stores keep.
    public var json: JSON {
        switch self {
        case .apns(let token, let env):
            return ["service": "apns", "token": .string(token), "environment": .string(env.rawValue)]
        case .fcm(let token):
            return ["service": "fcm", "token": .string(token)]
        case .webpush(let s):
            return ["service": "webpush",
                    "subscription": ["endpoint": .string(s.endpoint),
                                     "keys": ["p256dh": .string(Base64URL.encode(s.p256dh)),
                                              "auth": .string(Base64URL.encode(s.auth))]]]
        }
    }

    /// What listings show: the service, never the token or subscription.
    public var listing: JSON { ["service": .string(service.rawValue)] }

    /// Reads and validates a handle's form (SPEC section 10). Which services
    /// the app configured, which Web Push hosts it allows, and whether a
    /// subscription's key lies on P-256 are the gateway's to judge
    /// (`PushSettings.refusal`).
    public init(json: JSON) throws(HeraldError) {
        var f = try Fields(json, what: "push")
        guard let service = try f.enumValue("service", PushService.self) else { throw .badRequest("push.service is required") }
        switch service {
        case .apns:
            let token = try f.requiredString("token", maxBytes: 200).lowercased()
            guard (64...200).contains(token.utf8.count), token.utf8.allSatisfy(Self.isHexDigit) else {
                throw .badRequest("push.token must be 64-200 hexadecimal digits (an APNs device token)")
            }
            self = .apns(token: token, environment: try f.enumValue("environment", APNsEnvironment.self) ?? .production)
        case .fcm:
            let token = try f.requiredString("token", maxBytes: 4096)
            guard !token.isEmpty, token.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7F }) else {
                throw .badRequest("push.token must be 1-4096 printable ASCII characters (an FCM registration token)")
            }
            self = .fcm(token: token)
        case .webpush:
            guard let sub = try f.object("subscription") else { throw .badRequest("push.subscription is required") }
            self = .webpush(try Self.subscription(sub))
        }
        try f.finish()
    }

    private static func subscription(_ o: JSONObject) throws(HeraldError) -> WebPushSubscription {
        var f = try Fields(.object(o), what: "push.subscription")
        let endpoint = try f.requiredString("endpoint", maxBytes: 2048)
        guard let url = httpsOrigin(endpoint) else {
            throw .badRequest("push.subscription.endpoint must be an https URL with a host name, no user info")
        }
        guard let keys = try f.object("keys") else { throw .badRequest("push.subscription.keys is required") }
        // Browsers add expirationTime (null or a time); it means nothing to the sender.
        _ = f.raw("expirationTime")
        try f.finish()
        var k = try Fields(.object(keys), what: "push.subscription.keys")
        guard let p256dh = Base64URL.decode(optionallyPadded: try k.requiredString("p256dh", maxBytes: 128)[...]),
              p256dh.count == 65, p256dh[0] == 0x04 else {
            throw .badRequest("push.subscription.keys.p256dh must be a base64url P-256 public key (65 bytes)")
        }
        guard let auth = Base64URL.decode(optionallyPadded: try k.requiredString("auth", maxBytes: 64)[...]), auth.count == 16 else {
            throw .badRequest("push.subscription.keys.auth must be 16 bytes, base64url")
        }
        try k.finish()
        return WebPushSubscription(endpoint: endpoint, host: url.host, port: url.port, origin: url.origin, p256dh: p256dh, auth: auth)
    }

    /// The lower-cased host, the port (nil when none is given, or 443) and
    /// the lower-cased origin of an `https://` URL with no user info, nil
    /// for anything else. Deliberately strict, for it decides where Herald
    /// will POST: a host is letters, digits, dots and hyphens; an IPv6
    /// literal only in brackets; a port 1-65535 in digits.
    public static func httpsOrigin(_ url: String) -> (host: String, port: Int?, origin: String)? {
        guard url.utf8.count > 8, url.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7F }), url.prefix(8).lowercased() == "https://" else { return nil }
        let rest = url.utf8.dropFirst(8)
        let authorityEnd = rest.firstIndex { $0 == UInt8(ascii: "/") || $0 == UInt8(ascii: "?") || $0 == UInt8(ascii: "#") } ?? rest.endIndex
        let authority = String(decoding: rest[rest.startIndex..<authorityEnd], as: UTF8.self).lowercased()
        var host = authority, portText: Substring? = nil
        if authority.hasPrefix("[") {
            guard let close = authority.firstIndex(of: "]") else { return nil }
            host = String(authority[...close])
            let inside = authority.dropFirst().prefix { $0 != "]" }
            guard inside.contains(":"), inside.utf8.allSatisfy({ isHexDigit($0) || $0 == UInt8(ascii: ":") || $0 == UInt8(ascii: ".") }) else {
                return nil
            }
            let after = authority[authority.index(after: close)...]
            if !after.isEmpty {
                guard after.first == ":" else { return nil }
                portText = after.dropFirst()
            }
        } else {
            if let colon = authority.firstIndex(of: ":") {
                host = String(authority[..<colon])
                portText = authority[authority.index(after: colon)...]
            }
            guard !host.isEmpty, !host.hasPrefix("."), !host.hasSuffix("."), !host.contains(".."),
                  host.utf8.allSatisfy({ isHostByte($0) }) else { return nil }
        }
        var port: Int? = nil
        if let portText {
            guard !portText.isEmpty, portText.count <= 5, portText.utf8.allSatisfy({ (48...57).contains($0) }),
                  let p = Int(portText), (1...65535).contains(p) else { return nil }
            port = p == 443 ? nil : p
        }
        return (host, port, "https://" + authority)
    }

    private static func isHostByte(_ c: UInt8) -> Bool {
        switch c {
        case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "."), UInt8(ascii: "-"): true
        default: false
        }
    }

    private static func isHexDigit(_ c: UInt8) -> Bool {
        (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(c) || (UInt8(ascii: "a")...UInt8(ascii: "f")).contains(c)
    }

    /// Whether `host` and `port` (nil: 443) are on an allowed-hosts list.
    /// An entry is a host name, or `*.` and a domain for any host under it
    /// (not the domain itself), on port 443 unless it names another
    /// (`host:port`): a device chooses no port the operator did not.
    public static func allowed(host: String, port: Int?, by list: [String]) -> Bool {
        list.contains { entry in
            var e = Substring(entry.lowercased()), want: Int? = nil
            if let colon = e.lastIndex(of: ":"), !e.hasSuffix("]") {
                want = Int(e[e.index(after: colon)...]).flatMap { $0 == 443 ? nil : $0 }
                e = e[..<colon]
            }
            guard want == port else { return false }
            if e.hasPrefix("*.") { return host.hasSuffix(e.dropFirst(1)) && host.count > e.count - 1 }
            return host == e
        }
    }

    /// The public Web Push services' hosts: Chrome (FCM), Firefox (Mozilla
    /// autopush), Edge (WNS), Safari (Apple).
    public static let defaultWebPushHosts = [
        "fcm.googleapis.com", "updates.push.services.mozilla.com", "*.notify.windows.com",
        "web.push.apple.com",
    ]
}

/// What a registration says of the push handle: absent keeps it.
public enum PushUpdate: Sendable, Equatable {
    case set(PushHandle)
    case remove
}
