import Foundation
import HeraldCore
import HeraldCurl
import HeraldPorts

/// The `PushTransport` of `herald serve`: each app's senders, built from its
/// settings' credential files. A reload rebuilds an app's senders only when
/// its settings or the files' contents changed, so pushes in flight are not
/// cut off and sent twice; an app whose files no longer read keeps the
/// senders it had.
public final class PushSenders: PushTransport {
    private final class App: Sendable {
        let apns: APNsSender?
        /// Development devices' sender when the app has a sandbox-only key; else `apns` sends to both.
        let apnsDevelopment: APNsSender?
        let fcm: FCMSender?
        let webPush: WebPushSender?
        /// What it was built from: the settings and the credential files' bytes.
        let source: Source

        init(_ id: String, _ c: LoadedCredentials, pingInterval: Duration, source: Source) throws {
            if let a = c.apns, let development = a.forDevelopment {
                apns = try APNsSender(a, app: id, environments: [.production], pingInterval: pingInterval)
                apnsDevelopment = try APNsSender(development, app: id, environments: [.development], pingInterval: pingInterval)
            } else {
                apns = try c.apns.map { try APNsSender($0, app: id, pingInterval: pingInterval) }
                apnsDevelopment = nil
            }
            fcm = try c.fcm.map { try FCMSender($0, app: id, pingInterval: pingInterval) }
            webPush = try c.webPush.map { try WebPushSender($0, app: id) }
            self.source = source
        }

        func apns(_ environment: APNsEnvironment) -> APNsSender? { environment == .development ? apnsDevelopment ?? apns : apns }

        func stop() {
            apns?.stop()
            apnsDevelopment?.stop()
            fcm?.stop()
            webPush?.stop()
        }
    }

    private let apps = Locked<[String: App]>([:])
    private let tokens = Locked<SharedTokens?>(nil)

    /// Requests in flight, in all and so per client.
    static let maxInFlight = 1_000
    public var capacity: Int { Self.maxInFlight }
    /// Whole request, connection included: a hung service holds a push no longer.
    static let requestTimeout: Duration = .seconds(30)

    public init(_ apps: [AppConfig]) throws(PushCredentialError) {
        var built: [String: App] = [:]
        for a in apps {
            guard let s = a.push else { continue }
            built[a.id] = try Self.build(a.id, s)
        }
        self.apps.withLock { $0 = built }
    }

    private struct Source: Equatable, Sendable {
        let settings: PushSettings
        let files: [Data?]

        init(_ s: PushSettings) {
            settings = s
            files = [s.apns?.keyFile, s.apns?.developmentKeyFile, s.fcm?.serviceAccountFile, s.webPush?.vapidPrivateKeyFile]
                .map { $0.flatMap(FileManager.default.contents(atPath:)) }
        }
    }

    private static func build(_ id: String, _ s: PushSettings) throws(PushCredentialError) -> App {
        let source = Source(s)
        let c = try LoadedCredentials(s)
        do {
            return try App(id, c, pingInterval: .seconds(s.pingIntervalSeconds), source: source)
        } catch {
            throw PushCredentialError("app \(id): the push client could not start: \(error)")
        }
    }

    /// A push this transport has no sender for (stopping, or an app's
    /// service added by a reload a moment ago) goes back to the outbox to be
    /// sent again, never dropped: the gateway claimed it for a configured service.
    public func share(_ tokens: SharedTokens) { self.tokens.withLock { $0 = tokens } }

    public func send(_ push: OutgoingPush, completion: @escaping @Sendable (PushOutcome) -> Void) {
        // Encoding, signing and Web Push's encryption happen here, off the caller's (the engine's) thread.
        encoder.async { [self] in encode(push, completion) }
    }

    private let encoder = DispatchQueue(label: "herald-push-encode")

    private func encode(_ push: OutgoingPush, _ completion: @escaping @Sendable (PushOutcome) -> Void) {
        let app = apps.withLock { $0[push.job.user.app] }
        let notYet = PushOutcome.retry("no \(push.handle.service.rawValue) sender for app \(push.job.user.app) (stopping or reloading)",
                                       retryAfterSeconds: nil)
        switch push.handle {
        case .apns(let token, let env):
            guard let s = app?.apns(env), let tokens = tokens.withLock({ $0 }) else { return completion(notYet) }
            s.send(push, token: token, environment: env, tokens: tokens, completion: completion)
        case .fcm(let token):
            guard let s = app?.fcm else { return completion(notYet) }
            s.send(push, token: token, completion: completion)
        case .webpush(let sub):
            guard let s = app?.webPush else { return completion(notYet) }
            s.send(push, subscription: sub, completion: completion)
        }
    }

    public func reload(_ next: [AppConfig]) {
        var built: [String: App] = [:], retired: [App] = []
        let current = apps.withLock { $0 }
        for a in next {
            guard let s = a.push else { continue }
            if let old = current[a.id], old.source == Source(s) {
                built[a.id] = old
                continue
            }
            do { built[a.id] = try Self.build(a.id, s) } catch {
                Log.error("push: \(error.description); app \(a.id) keeps the credentials it had")
                if let old = current[a.id] { built[a.id] = old }
            }
        }
        for (id, old) in current where built[id] !== old { retired.append(old) }
        apps.withLock { $0 = built }
        // Requests still in flight on a retired client complete as retries.
        for r in retired { r.stop() }
    }

    public func stop() {
        let all = apps.withLock { a in defer { a.removeAll() }; return a }
        for a in all.values { a.stop() }
    }
}

extension PushMessage {
    /// FCM's `ttl` and Web Push's `TTL`: the lifetime left, rounded up and
    /// never 0, which means "now or never" (WNS refuses it). The gateway
    /// sends no push with less than a second left.
    func ttlSeconds(now: Millis) -> Int64 { max(1, (expiresAt - now + 999) / 1000) }
}
