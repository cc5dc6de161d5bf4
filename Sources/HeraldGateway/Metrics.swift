import Synchronization
import HeraldCore
import HeraldPorts

/// Prometheus metrics of SPEC section 6. Lock-free counters, cheap enough to
/// leave on under load.
public final class Metrics: Sendable {
    public enum DropReason: String, CaseIterable, Sendable {
        case slowConsumer = "slow_consumer", rateLimited = "rate_limited", idle, protocolError = "protocol_error",
             authExpired = "auth_expired", authRevoked = "auth_revoked"
    }

    /// Why a connection was turned away at accept.
    public enum RefusalReason: String, CaseIterable, Sendable {
        /// Past `maxConnections`: answered 503 with Retry-After.
        case capacity
        /// The process ran out of descriptors (EMFILE): closed unanswered.
        case descriptors
    }

    let connections = Locked([Int](repeating: 0, count: TransportKind.allCases.count))
    let drops = Locked([Int](repeating: 0, count: DropReason.allCases.count))
    let refusals = Locked([Int](repeating: 0, count: RefusalReason.allCases.count))
    public let publishes = Atomic<Int>(0)
    public let deliveries = Atomic<Int>(0)
    public let deliveryLatency = Histogram()
    public let storeLatency = Histogram()
    /// The engine's own transactions (expiry sweep, a pruning call, the
    /// lastSeen flush): no batch runs meanwhile.
    public let maintenanceLatency = Histogram()
    /// Commands waiting for each engine thread, by partition.
    private let engineQueues = Locked<[EngineQueue]>([])
    /// Batches run again after losing a conflict (a PostgreSQL deadlock).
    public let storeConflictRetries = Atomic<Int>(0)
    /// Live changes too many for a connection's unsent-data limit, sent
    /// from the store at the client's pace instead (`Subscription.deliverLive`).
    public let deferredBursts = Atomic<Int>(0)
    /// Shown once a bus is configured.
    public let bus = BusMetrics()
    /// Shown once an app configures push.
    public let push = PushMetrics()
    /// Shown once an app configures webhooks.
    public let webhooks = WebhookMetrics()

    public init() {}

    public func connectionOpened(_ t: TransportKind) { connections.withLock { $0[index(t)] += 1 } }
    public func connectionClosed(_ t: TransportKind) { connections.withLock { $0[index(t)] -= 1 } }
    public func dropped(_ r: DropReason) { drops.withLock { $0[DropReason.allCases.firstIndex(of: r)!] += 1 } }
    public func refused(_ r: RefusalReason) { refusals.withLock { $0[RefusalReason.allCases.firstIndex(of: r)!] += 1 } }

    private func index(_ t: TransportKind) -> Int { TransportKind.allCases.firstIndex(of: t)! }

    /// Partition `partition`'s queue count, made on first ask.
    func engineQueue(partition: Int) -> EngineQueue {
        engineQueues.withLock { queues in
            if let q = queues.first(where: { $0.partition == partition }) { return q }
            let q = EngineQueue(partition: partition)
            queues.append(q)
            return q
        }
    }

    /// Commands waiting for any engine thread.
    public var engineQueued: Int { engineQueues.withLock { $0.reduce(0) { $0 + $1.waiting.load(ordering: .relaxed) } } }

    /// This node's open connections, by transport name.
    func openConnections() -> [(String, Int)] { Array(zip(TransportKind.allCases.map(\.rawValue), connections.withLock { $0 })) }

    /// One metric's HELP and TYPE lines, then a series per value of its one label.
    static func family(_ name: String, _ type: String, _ help: String, label: String, _ rows: some Sequence<(String, Int)>) -> String {
        var s = "# HELP \(name) \(help)\n# TYPE \(name) \(type)\n"
        for (value, n) in rows { s += "\(name){\(label)=\"\(value)\"} \(n)\n" }
        return s
    }

    public func prometheusText() -> String {
        var s = Self.family("herald_connections", "gauge", "Open device connections by transport.", label: "transport", openConnections())
        s += "# HELP herald_publishes_total Notifications published.\n# TYPE herald_publishes_total counter\n"
        s += "herald_publishes_total \(publishes.load(ordering: .relaxed))\n"
        s += "# HELP herald_deliveries_total Changes delivered to devices.\n# TYPE herald_deliveries_total counter\n"
        s += "herald_deliveries_total \(deliveries.load(ordering: .relaxed))\n"
        s += deliveryLatency.text(name: "herald_delivery_latency_seconds", help: "From the commit of a change to its hand-off to the followers' sockets, one observation per user and shard.")
        s += storeLatency.text(name: "herald_store_latency_seconds", help: "Store batch time, begin to commit.")
        s += maintenanceLatency.text(name: "herald_maintenance_seconds", help: "Engine time of each maintenance transaction (expiry sweep, pruning call, lastSeen flush, presence, planner statistics check), begin to commit; no batch runs meanwhile.")
        s += Self.family("herald_engine_queue", "gauge", "Commands waiting for each partition's engine (store writes and what must follow them).",
                         label: "partition", engineQueues.withLock { $0.map { ("\($0.partition)", $0.waiting.load(ordering: .relaxed)) } })
        s += "# HELP herald_store_conflict_retries_total Batches run again after a deadlock, a serialization failure or a lock wait that ran out (a node frozen mid-transaction) with another node.\n# TYPE herald_store_conflict_retries_total counter\n"
        s += "herald_store_conflict_retries_total \(storeConflictRetries.load(ordering: .relaxed))\n"
        s += "# HELP herald_deferred_bursts_total Live changes that would have taken a connection past its unsent-data limit, sent from the store as the client read instead.\n# TYPE herald_deferred_bursts_total counter\n"
        s += "herald_deferred_bursts_total \(deferredBursts.load(ordering: .relaxed))\n"
        s += Self.family("herald_dropped_connections_total", "counter", "Connections closed by the gateway.", label: "reason",
                         zip(DropReason.allCases.map(\.rawValue), drops.withLock { $0 }))
        s += Self.family("herald_refused_connections_total", "counter", "Connections turned away at accept.", label: "reason",
                         zip(RefusalReason.allCases.map(\.rawValue), refusals.withLock { $0 }))
        if bus.enabled.load(ordering: .relaxed) { s += bus.text() }
        if push.enabled.load(ordering: .relaxed) { s += push.text() }
        if webhooks.enabled.load(ordering: .relaxed) { s += webhooks.text() }
        return s
    }
}

/// One partition's count of commands waiting for its engine thread: kept
/// apart so a reader can tell a blocked partition from a busy neighbour.
final class EngineQueue: Sendable {
    let partition: Int
    let waiting = Atomic<Int>(0)
    init(partition: Int) { self.partition = partition }
}

/// `herald_bus_*` as `/metrics` shows them (the counters are HeraldPorts', beside the bus).
extension BusMetrics {
    func text() -> String {
        func line(_ name: String, _ type: String, _ help: String, _ v: borrowing Atomic<Int>) -> String {
            "# HELP herald_bus_\(name) \(help)\n# TYPE herald_bus_\(name) \(type)\nherald_bus_\(name) \(v.load(ordering: .relaxed))\n"
        }
        return line("connected", "gauge", "1 while subscribed to the bus.", connected)
            + line("resubscriptions_total", "counter", "Subscriptions after a lost bus connection; each catches every follower up.", resubscriptions)
            + line("published_total", "counter", "Change records published on the bus.", published)
            + line("received_total", "counter", "Change records received from other nodes for users followed here.", received)
            + line("publish_queue", "gauge", "Change records waiting to be published.", queued)
            + line("dropped_total", "counter", "Change records never published (queue full while the bus was away).", dropped)
            + line("catchups_total", "counter", "Users whose followers were caught up from the store: a seq past the next expected (a record missed or reordered on the bus).", catchUps)
            + line("missed_total", "counter", "Users whose feed head stayed past what reached this node, for a change that never came over the bus; their followers were caught up from the store.", missed)
    }
}

public final class Histogram: Sendable {
    static let bounds: [Double] = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5]
    struct State { var buckets = [Int](repeating: 0, count: Histogram.bounds.count + 1); var sumNanos: UInt64 = 0 }
    let state = Locked(State())

    public init() {}

    public func observe(nanos: UInt64) {
        let secs = Double(nanos) / 1e9
        let i = Self.bounds.firstIndex { secs <= $0 } ?? Self.bounds.count
        state.withLock { $0.buckets[i] += 1; $0.sumNanos &+= nanos }
    }

    func text(name: String, help: String) -> String {
        var s = "# HELP \(name) \(help)\n# TYPE \(name) histogram\n"
        let st = state.withLock { $0 }
        var cumulative = 0
        for (i, b) in Self.bounds.enumerated() {
            cumulative += st.buckets[i]
            s += "\(name)_bucket{le=\"\(b)\"} \(cumulative)\n"
        }
        cumulative += st.buckets[Self.bounds.count]
        s += "\(name)_bucket{le=\"+Inf\"} \(cumulative)\n"
        s += "\(name)_sum \(Double(st.sumNanos) / 1e9)\n\(name)_count \(cumulative)\n"
        return s
    }
}

