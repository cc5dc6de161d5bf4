import HeraldCore
import HeraldCrypto

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

    public init(id: String, serverKeys: [String], tokenSecrets: [TokenSecret], allowedOrigins: [String] = [], push: PushSettings? = nil) {
        precondition(!serverKeys.isEmpty && !tokenSecrets.isEmpty, "app \(id) needs a server key and a token secret")
        self.id = id; self.serverKeys = serverKeys; self.tokenSecrets = tokenSecrets; self.allowedOrigins = allowedOrigins
        self.push = push
    }

    /// One key and one secret without kid: the form without rotation.
    public init(id: String, serverKey: String, tokenSecret: String, allowedOrigins: [String] = [], push: PushSettings? = nil) {
        self.init(id: id, serverKeys: [serverKey], tokenSecrets: [TokenSecret(secret: tokenSecret)], allowedOrigins: allowedOrigins,
                  push: push)
    }

    public var signingSecret: TokenSecret { tokenSecrets[0] }
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

    /// Why this app cannot take `handle`, nil when it can: its service is
    /// configured, and a Web Push endpoint is on an allowed host (a device
    /// must never make Herald POST where it likes).
    public func refusal(_ handle: PushHandle) -> HeraldError? {
        guard offers(handle.service) else {
            return .badRequest("push service \(handle.service.rawValue) is not configured for this app"
                               + " (it has \(services.isEmpty ? "none" : services.map(\.rawValue).joined(separator: ", ")))")
        }
        guard case .webpush(let s) = handle, let w = webPush else { return nil }
        // The domain checks the key's form; whether it lies on the curve takes libcrypto.
        guard EllipticCurve.isP256Point(s.p256dh) else {
            return .badRequest("push.subscription.keys.p256dh is not a point on P-256")
        }
        if !PushHandle.allowed(host: s.host, port: s.port, by: w.allowedHosts) {
            return .badRequest("push.subscription.endpoint's host \(s.host)\(s.port.map { ":\($0)" } ?? "") is not one of this app's allowed push hosts")
        }
        return nil
    }
}

/// Tunables, each documented in docs/OPERATIONS.md.
public struct GatewayLimits: Sendable, Equatable {
    /// Live data queued unsent per connection; changes past it are read
    /// from the store as the client reads (`Subscription.deliverLive`).
    public var maxQueuedBytesPerConnection = 4 << 20
    /// Incoming WebSocket message size (fragments counted together).
    public var maxMessageBytes = 256 * 1024
    /// HTTP request bodies; larger is 413.
    public var maxBodyBytes = 1 << 20
    public var helloTimeoutSeconds: Int64 = 10
    /// How long tombstones (delete changes) and other changes are kept.
    public var changeRetentionSeconds: Int64 = 7 * 86_400
    /// Registrations unused this long lapse.
    public var deviceLapseSeconds: Int64 = 90 * 86_400
    /// Sends WebSocket pings after this much silence; drops after `idleHangupSeconds`.
    public var pingIntervalSeconds = 30
    public var idleHangupSeconds = 45
    /// Open connections (HTTP and WebSocket) per process; past it a request
    /// or upgrade is answered `503` with `Retry-After`. 0: the process's
    /// descriptor limit less a reserve (`Server.connectionCap`).
    public var maxConnections = 0
    /// Open WebSocket and SSE connections per user; one more is refused.
    public var maxConnectionsPerUser = 50
    /// Registered devices per user: a new one past it takes the place of
    /// the one not connected and seen longest ago, or is refused when all are.
    public var maxDevicesPerUser = 100
    /// WebSocket messages a connection may send per second (burst: twice
    /// that); past it the connection closes with 4008.
    public var messagesPerSecondPerConnection = 50
    /// Publishes per second per app (burst: twice that); past it `429`.
    public var publishesPerSecondPerApp = 50_000
    /// Long-polls held at once by the whole gateway; past it `429`.
    public var maxHeldPolls = 10_000
    /// An HTTP request must arrive whole (head and body) within this many
    /// seconds of its first byte, and a new connection's first bytes within
    /// this many seconds of its accept; else the connection is closed.
    public var requestTimeoutSeconds = 20
    /// HTTP output (an answer, an event stream) waiting for a socket that
    /// takes none of it for this many seconds closes the connection.
    public var writeTimeoutSeconds = 30
    public init() {}
}

public struct GatewayConfig: Sendable {
    /// The apps at start; `Gateway.reload(apps:)` puts others in force.
    public var apps: [AppConfig]
    public var demo: Bool
    public var limits: GatewayLimits
    /// Folder served at `/` in demo mode.
    public var webRoot: String?
    /// A worker of `herald serve --workers N`: `/metrics` answers for every worker.
    public var workerMetrics: WorkerMetrics?

    /// The app that exists in demo mode. Its server key is well known (the
    /// demo page publishes with it: demo mode is for trying Herald only); its
    /// token secret is fresh each start.
    public let demoApp = AppConfig(id: "demo", serverKey: "demo-server-key", tokenSecret: Random.hex(32))

    public init(apps: [AppConfig], demo: Bool = false, limits: GatewayLimits = GatewayLimits(), webRoot: String? = nil) {
        self.apps = apps; self.demo = demo; self.limits = limits; self.webRoot = webRoot
    }

    public var allApps: [AppConfig] {
        demo && !apps.contains(where: { $0.id == demoApp.id }) ? apps + [demoApp] : apps
    }
}
