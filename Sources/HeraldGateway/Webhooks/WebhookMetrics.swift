import HeraldPorts
import Synchronization

/// `herald_webhook_*` (SPEC section 13): shown once an app configures webhooks.
public final class WebhookMetrics: Sendable {
    public enum Outcome: String, CaseIterable, Sendable { case delivered, retried, expired }

    let enabled = Atomic<Bool>(false)
    private let sent = Locked([Int](repeating: 0, count: Outcome.allCases.count))
    public let pending = Atomic<Int>(0)
    /// From the change's commit to the receiver's 2xx.
    public let latency = Histogram()

    public init() {}

    func count(_ outcome: Outcome, _ n: Int = 1) { sent.withLock { $0[Outcome.allCases.firstIndex(of: outcome)!] += n } }

    public func sent(_ outcome: Outcome) -> Int { sent.withLock { $0[Outcome.allCases.firstIndex(of: outcome)!] } }

    func text() -> String {
        var s = Metrics.family("herald_webhook_sent_total", "counter", "Webhook deliveries, by outcome.", label: "outcome",
                               zip(Outcome.allCases.map(\.rawValue), sent.withLock { $0 }))
        s += "# HELP herald_webhook_pending Webhook deliveries waiting in the outbox or in flight.\n# TYPE herald_webhook_pending gauge\n"
        s += "herald_webhook_pending \(pending.load(ordering: .relaxed))\n"
        s += latency.text(name: "herald_webhook_latency_seconds", help: "From the commit of a change to the receiver's 2xx for its event.")
        return s
    }
}
