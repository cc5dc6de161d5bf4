import HeraldCore

/// An app and its credentials. Several keys and secrets live side by side
/// while they are rotated (docs/OPERATIONS.md, "Rotating keys").
public struct AppConfig: Sendable, Equatable {
    public let id: String
    /// Each is accepted.
    public let serverKeys: [String]
    /// Newest first: the first signs the tokens Herald issues; all verify.
    public let tokenSecrets: [TokenSecret]
    /// Origins (`scheme://host[:port]`, or `*` for any) whose browser pages
    /// may read this app's answers (CORS.swift); none by default.
    public let allowedOrigins: [String]
    /// The push services this app wakes devices through (SPEC section 10); nil: none.
    public let push: PushSettings?
    /// Groups whose notifications reach the inbox and push whatever users
    /// chose (SPEC section 12).
    public let criticalGroups: [String]
    /// Where this app's events go (SPEC section 13); none by default.
    public let webhooks: [WebhookEndpoint]

    public init(id: String, serverKeys: [String], tokenSecrets: [TokenSecret], allowedOrigins: [String] = [], push: PushSettings? = nil,
                criticalGroups: [String] = [], webhooks: [WebhookEndpoint] = []) {
        precondition(!serverKeys.isEmpty && !tokenSecrets.isEmpty, "app \(id) needs a server key and a token secret")
        self.id = id; self.serverKeys = serverKeys; self.tokenSecrets = tokenSecrets; self.allowedOrigins = allowedOrigins
        self.push = push; self.criticalGroups = criticalGroups; self.webhooks = webhooks
    }

    /// One key and one secret without kid: the form without rotation.
    public init(id: String, serverKey: String, tokenSecret: String, allowedOrigins: [String] = [], push: PushSettings? = nil,
                criticalGroups: [String] = []) {
        self.init(id: id, serverKeys: [serverKey], tokenSecrets: [TokenSecret(secret: tokenSecret)], allowedOrigins: allowedOrigins,
                  push: push, criticalGroups: criticalGroups)
    }

    public var signingSecret: TokenSecret { tokenSecrets[0] }
}

/// One `webhooks` entry of an app (SPEC section 13, docs/OPERATIONS.md
/// "Webhooks"). Its description leaves the secrets out: they are never logged.
public struct WebhookEndpoint: Sendable, Equatable, CustomStringConvertible {
    /// `http://` or `https://`: the outbox keeps its events under it.
    public let url: String
    /// The keys (the bytes after `whsec_`), newest first: each signs.
    public let secrets: [[UInt8]]
    /// The types sent; nil: all.
    public let events: Set<WebhookEventType>?
    public let caFile: String?

    public init(url: String, secrets: [[UInt8]], events: Set<WebhookEventType>? = nil, caFile: String? = nil) {
        self.url = url; self.secrets = secrets; self.events = events; self.caFile = caFile
    }

    public func takes(_ type: WebhookEventType) -> Bool { events?.contains(type) ?? true }

    public var description: String { "webhook \(url)" }

    /// The key of a Standard Webhooks secret, `whsec_` and the base64 of 24
    /// to 64 bytes; nil when it is not one.
    public static func key(ofSecret s: String) -> [UInt8]? {
        guard s.hasPrefix("whsec_"), let key = Base64.decode(s.dropFirst(6)), (24...64).contains(key.count) else { return nil }
        return key
    }
}

/// An app's push credentials and options (SPEC section 10, docs/OPERATIONS.md
/// "Push"). Holds paths, not key material: the senders read the files
/// (HeraldPush), at start and at each reload.
public struct PushSettings: Sendable, Equatable {
    public struct APNs: Sendable, Equatable {
        public var teamId: String
        public var keyId: String
        public var keyFile: String
        /// The app's bundle id (`apns-topic`).
        public var topic: String
        /// A key Apple limited to the sandbox, for devices registered
        /// `development` (the other key then serves production only); both or neither.
        public var developmentKeyId: String?
        public var developmentKeyFile: String?
        public var endpoint = "https://api.push.apple.com"
        public var developmentEndpoint = "https://api.sandbox.push.apple.com"
        public var caFile: String?
        public init(teamId: String, keyId: String, keyFile: String, topic: String) {
            self.teamId = teamId; self.keyId = keyId; self.keyFile = keyFile; self.topic = topic
        }
    }

    public struct FCM: Sendable, Equatable {
        public var serviceAccountFile: String
        public var endpoint = "https://fcm.googleapis.com"
        public var caFile: String?
        public init(serviceAccountFile: String) { self.serviceAccountFile = serviceAccountFile }
    }

    public struct WebPush: Sendable, Equatable {
        public var vapidPrivateKeyFile: String
        /// `mailto:` or `https:`: whom the push service may contact (RFC 8292 `sub`).
        public var subject: String
        public var allowedHosts = PushHandle.defaultWebPushHosts
        public var caFile: String?
        /// The VAPID public key, unpadded base64url: what browsers subscribe with.
        public var publicKey: String
        public init(vapidPrivateKeyFile: String, subject: String, publicKey: String) {
            self.vapidPrivateKeyFile = vapidPrivateKeyFile; self.subject = subject; self.publicKey = publicKey
        }

        /// What is wrong with `subject` as a VAPID `sub`, nil when nothing:
        /// `mailto:` and one address with no spaces or angle brackets, or an
        /// `https:` URL; not a `localhost` or loopback address. Apple's push
        /// service refuses the others, which RFC 8292 alone would allow.
        public static func subjectProblem(_ subject: String) -> String? {
            let local = { (host: String) in
                host == "localhost" || host.hasSuffix(".localhost") || host.hasPrefix("127.") || host == "[::1]"
            }
            if subject.hasPrefix("mailto:") {
                let address = subject.dropFirst("mailto:".count)
                let parts = address.split(separator: "@", omittingEmptySubsequences: false)
                guard parts.count == 2, !parts[0].isEmpty, !parts[1].isEmpty,
                      address.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7F && $0 != UInt8(ascii: "<") && $0 != UInt8(ascii: ">") && $0 != UInt8(ascii: ",") }) else {
                    return "must be mailto: and one address, with no spaces or angle brackets (mailto:ops@example.com)"
                }
                return local(parts[1].lowercased()) ? "must not be a localhost address (Apple refuses it)" : nil
            }
            if subject.hasPrefix("https:") {
                guard let url = PushHandle.httpsOrigin(subject) else { return "must be an https:// URL with a host name" }
                return local(url.host) ? "must not be a localhost address (Apple refuses it)" : nil
            }
            return "must start with mailto: or https: (RFC 8292)"
        }
    }

    /// Where a notification's payload holds an alert's title and body; nil: taps only.
    public var alert: AlertPointers?
    public var apns: APNs?
    public var fcm: FCM?
    public var webPush: WebPush?
    /// The least time between two taps to one device (iOS budgets
    /// background pushes and silently drops those over budget).
    public var tapIntervalSeconds = 15
    /// How long a connection to APNs or FCM idles before an HTTP/2 PING, and between PINGs.
    public var pingIntervalSeconds = 60

    public init(alert: AlertPointers? = nil, apns: APNs? = nil, fcm: FCM? = nil, webPush: WebPush? = nil) {
        self.alert = alert; self.apns = apns; self.fcm = fcm; self.webPush = webPush
    }

    public func offers(_ service: PushService) -> Bool {
        switch service {
        case .apns: apns != nil
        case .fcm: fcm != nil
        case .webpush: webPush != nil
        }
    }

    public var services: [PushService] { PushService.allCases.filter(offers) }
}
