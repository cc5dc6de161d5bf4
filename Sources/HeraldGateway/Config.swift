import HeraldCore
import HeraldCrypto
import HeraldPorts

extension PushSettings {
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
    /// Folder served at `/admin`, the inspector's page, in any mode.
    public var adminRoot: String?
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
