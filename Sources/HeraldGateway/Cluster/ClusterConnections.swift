import HeraldCore

/// Presence across nodes (docs/ARCHITECTURE.md): this node's connected
/// devices, recorded in the shared store under its node id for the other
/// nodes' devices listings, behind a lease renewed every `renewEvery`. A
/// node that dies stops renewing, and its devices drop out of every listing
/// once its lease ends: at most `leaseMillis` after its death. Changes are
/// written in one transaction per `flushEvery` at most, whatever the
/// connection churn. Engine thread only; only with a bus and a store that
/// is a `ClusterDirectory` (PostgreSQL).
final class ClusterConnections {
    static let renewEvery: Millis = 3_000
    static let leaseMillis: Millis = 10_000
    static let flushEvery: Millis = 250
    static let pruneEvery: Millis = 60_000
    /// A device that only polls is recorded until `pollGrace` past the
    /// listing's minute after its last poll, and recorded again only once
    /// that moved by as much: a device polling every few seconds costs one
    /// write per 15 s, and shows as `poll` on other nodes 60 to 75 s after
    /// its last poll.
    static let pollGrace: Millis = 15_000

    let node: String
    private let directory: ClusterDirectory
    private let registry: FollowerRegistry

    /// What the store holds for this node's devices, as last committed.
    private struct Record: Equatable {
        var transport: TransportKind
        /// This node's clock; nil for an open connection.
        var until: Millis?
    }
    private var written: [UserKey: [String: Record]] = [:]
    private var nextFlush: Millis = 0
    private var nextRenew: Millis = 0
    private var nextPrune: Millis = 0

    /// The id partition `partition` of gateway node `gateway` records its devices under.
    static func node(_ gateway: String, partition: Int) -> String { "\(gateway)-\(partition)" }

    /// The gateway node of a record's id (`node(_:partition:)`).
    static func gateway(of node: String) -> String {
        node.lastIndex(of: "-").map { String(node[..<$0]) } ?? node
    }

    init(node: String, directory: ClusterDirectory, registry: FollowerRegistry) {
        self.node = node; self.directory = directory; self.registry = registry
        registry.presenceDirty = [:]
    }

    /// What other nodes should see of a device: an open connection's
    /// transport, or a poll until its minute (and grace) ends.
    private static func record(_ c: DeviceConnections?, now: Millis) -> Record? {
        guard let c, let t = c.transport(now: now) else { return nil }
        if t == .poll && c.heldPolls == 0 { return Record(transport: .poll, until: c.lastPollAt + 60_000 + pollGrace) }
        return Record(transport: t, until: nil)
    }

    private static func needsWrite(_ want: Record?, over had: Record?) -> Bool {
        guard let want, let had, want.transport == .poll, had.transport == .poll,
              let w = want.until, let h = had.until else { return want != had }
        return w - h >= pollGrace
    }

    /// Renews the lease when due and records what changed, in one transaction.
    /// `now`: wall time, as the records' times; `tick`: when each step is due.
    func flush(_ transactions: Transactions, now: Millis, tick: Millis) {
        guard tick >= nextFlush else { return }
        nextFlush = tick + Self.flushEvery
        let renew = tick >= nextRenew, prune = tick >= nextPrune
        guard renew || prune || registry.presenceDirty?.isEmpty == false else { return }
        transactions.run("presence") { tx throws(StoreError) in
            var base = written
            var dirty = registry.presenceDirty ?? [:]
            if renew, try !directory.renewLease(node: node, millis: Self.leaseMillis) {
                base = [:]
                dirty = registry.connectedDevices
            }
            if prune { try directory.pruneConnections(node: node) }
            var next = base
            for (user, ids) in dirty {
                for id in ids {
                    let want = Self.record(registry.connections(user, device: id), now: now)
                    let had = base[user]?[id]
                    guard Self.needsWrite(want, over: had) else { continue }
                    try directory.setConnection(node: node, user, device: id, transport: want?.transport.rawValue,
                                                millis: want?.until.map { $0 - now })
                    next[user, default: [:]][id] = want
                    if next[user]?.isEmpty == true { next[user] = nil }
                }
            }
            if prune {
                // The store dropped this node's expired poll records just now.
                next = next.compactMapValues { m in
                    let kept = m.filter { $0.value.until.map { $0 > now } ?? true }
                    return kept.isEmpty ? nil : kept
                }
            }
            tx.afterCommit { [self] in
                written = next
                registry.presenceDirty = [:]
                if renew { nextRenew = tick + Self.renewEvery }
                if prune { nextPrune = tick + Self.pruneEvery }
            }
        }
    }

    /// `user`'s devices connected to other live nodes, each with its best
    /// transport (`TransportKind`'s order).
    func elsewhere(_ user: UserKey) throws(StoreError) -> [String: TransportKind] {
        var out: [String: TransportKind] = [:]
        for (device, name) in try directory.connections(user, otherThan: node) {
            guard let t = TransportKind(rawValue: name) else { continue }
            out[device] = out[device].map { TransportKind.best($0, t) } ?? t
        }
        return out
    }

    /// The gateway stops: its devices are shown disconnected at once.
    func retire(_ transactions: Transactions) {
        transactions.run("presence (retiring the node)") { _ throws(StoreError) in try directory.retire(node: node) }
    }
}

extension TransportKind {
    /// The one a listing shows for a device connected in both ways.
    static func best(_ a: TransportKind, _ b: TransportKind) -> TransportKind {
        let order = allCases
        return order.firstIndex(of: a)! <= order.firstIndex(of: b)! ? a : b
    }
}
