import HeraldCore
import HeraldPorts
import Synchronization

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
