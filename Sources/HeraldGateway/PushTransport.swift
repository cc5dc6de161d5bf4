import HeraldCore
import Synchronization

/// A push on its way to a service: the outbox row, and the handle read
/// from the registration in the transaction that claimed it.
public struct OutgoingPush: Sendable {
    public let job: PushJob
    public let handle: PushHandle
    /// The app's settings when it was claimed.
    public let settings: PushSettings
}

/// What a push service answered (SPEC section 10, "Outcomes").
public enum PushOutcome: Sendable, Equatable {
    /// 2xx.
    case delivered
    /// The handle is dead (APNs 410, BadDeviceToken; FCM UNREGISTERED, SENDER_ID_MISMATCH; Web Push 404/410).
    /// `reason`: the service's reason code (or HTTP status), from a bounded
    /// set: a metric's label and what `PushHealth` judges.
    case unregistered(String, reason: String)
    /// 429, 5xx, Web Push 406, a timeout or a network error: again later, no sooner than `retryAfterSeconds`.
    case retry(String, retryAfterSeconds: Int?)
    /// The app's credentials were refused (APNs 403, FCM 401 and other 403s): kept and retried.
    case credentialsRefused(String)
    /// Any other refusal of this push (a 4xx that names no handle): dropped.
    /// `reason` as for `unregistered`.
    case rejected(String, reason: String)
}

/// The push services, behind one call (HeraldPush implements it). `send`
/// never blocks: it hands the push to the sender's own threads, and
/// `completion` runs on one of them, once.
public protocol PushTransport: AnyObject, Sendable {
    /// Pushes it takes unanswered at once: the outbox hands it no more, and
    /// keeps the rest in the store.
    var capacity: Int { get }
    func send(_ push: OutgoingPush, completion: @escaping @Sendable (PushOutcome) -> Void)
    /// Where the senders keep what every process and node of the
    /// deployment shares; given by the gateway once, before any `send`.
    func share(_ tokens: SharedTokens)
    /// Reads every app's credentials again (SIGHUP); an app whose files do
    /// not read keeps the ones it had.
    func reload(_ apps: [AppConfig])
    /// Ends every request in flight (each completes with a retry) and the threads.
    func stop()
}

/// Tokens the push senders share with every process and node of the
/// deployment (SPEC section 10: Apple asks for few APNs provider tokens per
/// team, and refuses one renewed within 20 minutes), kept in the store.
public protocol SharedTokens: Sendable {
    /// The token kept under `name` if it was made less than `renewAfter`
    /// ago; else one `make(now)` signs, kept in its place, unless another
    /// process renewed it first (then that one). `completion` runs once,
    /// on the engine's thread (`Engine.exchange`): nil when the store could
    /// not be reached or the gateway is stopping.
    func token(_ name: String, renewAfter: Millis, make: @escaping @Sendable (Millis) -> String,
               completion: @escaping @Sendable (SharedToken?) -> Void)
}

/// `SharedTokens` in the first partition's store: the database every node
/// of a PostgreSQL deployment shares, the SQLite file, a memory store's
/// process.
struct StoreTokens: SharedTokens {
    let engine: Engine

    func token(_ name: String, renewAfter: Millis, make: @escaping @Sendable (Millis) -> String,
               completion: @escaping @Sendable (SharedToken?) -> Void) {
        engine.exchange({ e throws(StoreError) in
            let now = e.clock.now()
            let kept = try e.reads.sharedToken(name)
            if let kept, now - kept.issuedAt < renewAfter { return kept }
            let made = SharedToken(value: make(now), issuedAt: now)
            if try e.tx.replaceSharedToken(name, with: made, replacing: kept?.issuedAt) { return made }
            // Another process renewed it a moment ago.
            return try e.reads.sharedToken(name)
        }, reply: { completion($0 ?? nil) })
    }
}

/// `herald_push_*` (SPEC section 10): shown once an app configures push.
public final class PushMetrics: Sendable {
    public enum Outcome: String, CaseIterable, Sendable { case delivered, retried, unregistered, rejected, expired }

    let enabled = Atomic<Bool>(false)
    let sent = Locked([Int](repeating: 0, count: PushService.allCases.count * Outcome.allCases.count))
    /// `unregistered` and `rejected` by the service's reason code (a bounded set: see `PushOutcome`).
    private let byReason = Locked<[ReasonKey: Int]>([:])
    public let pending = Atomic<Int>(0)
    /// From the change's commit to the service's 2xx.
    public let latency = Histogram()
    /// What `/healthz` says: one for the gateway, since a push answered on
    /// one partition may be sent again by another (a shared outbox).
    let health = PushHealth()

    private struct ReasonKey: Hashable, Comparable {
        let service: PushService, outcome: Outcome, reason: String
        static func < (a: Self, b: Self) -> Bool {
            (a.service.rawValue, a.outcome.rawValue, a.reason) < (b.service.rawValue, b.outcome.rawValue, b.reason)
        }
    }

    public init() {}

    private static func index(_ service: PushService, _ outcome: Outcome) -> Int {
        PushService.allCases.firstIndex(of: service)! * Outcome.allCases.count + Outcome.allCases.firstIndex(of: outcome)!
    }

    func count(_ service: PushService, _ outcome: Outcome, reason: String? = nil) {
        sent.withLock { $0[Self.index(service, outcome)] += 1 }
        if let reason { byReason.withLock { $0[ReasonKey(service: service, outcome: outcome, reason: reason), default: 0] += 1 } }
    }

    public func sent(_ service: PushService, _ outcome: Outcome) -> Int { sent.withLock { $0[Self.index(service, outcome)] } }

    public func sent(_ service: PushService, _ outcome: Outcome, reason: String) -> Int {
        byReason.withLock { $0[ReasonKey(service: service, outcome: outcome, reason: reason)] ?? 0 }
    }

    /// The outcomes that name a reason are shown by it, as they occur.
    private static let reasoned: Set<Outcome> = [.unregistered, .rejected]

    func text() -> String {
        var s = "# HELP herald_push_sent_total Pushes handed to a push service, by service and outcome"
            + " (unregistered and rejected also by the service's reason).\n# TYPE herald_push_sent_total counter\n"
        let counts = sent.withLock { $0 }
        for (i, service) in PushService.allCases.enumerated() {
            for (j, outcome) in Outcome.allCases.enumerated() where !Self.reasoned.contains(outcome) {
                s += "herald_push_sent_total{service=\"\(service.rawValue)\",outcome=\"\(outcome.rawValue)\"} \(counts[i * Outcome.allCases.count + j])\n"
            }
        }
        for (k, n) in byReason.withLock({ $0 }).sorted(by: { $0.key < $1.key }) {
            s += "herald_push_sent_total{service=\"\(k.service.rawValue)\",outcome=\"\(k.outcome.rawValue)\",reason=\"\(k.reason)\"} \(n)\n"
        }
        s += "# HELP herald_push_pending Pushes waiting in the outbox or in flight.\n# TYPE herald_push_pending gauge\n"
        s += "herald_push_pending \(pending.load(ordering: .relaxed))\n"
        s += latency.text(name: "herald_push_latency_seconds", help: "From the commit of a change to the push service's 2xx for its push.")
        return s
    }
}
