import HeraldCore

/// With a bus: the net under `FollowerRegistry.sequence`, which sees a
/// missed record only when a later one of the same user arrives. A change
/// that committed but never came over the bus (its node died between commit
/// and publish, Redis dropped it, the answer to its COMMIT was lost, the bus
/// is down) would otherwise reach this node's devices only with the user's
/// next change, perhaps never.
///
/// Every `every`, the engine reads the committed feed heads of the users
/// followed here, `chunk` users a maintenance run, and keeps those whose
/// head is past the last seq delivered here. One still behind that head
/// `grace` later missed a change: its followers catch up from the store
/// (docs/ARCHITECTURE.md, "Changes across nodes"). The grace lets records
/// in flight arrive first (the bus, the engine's queue), so a busy node
/// does not read back what is on its way. Engine thread only.
struct FeedAudit {
    static let every: Millis = 5_000
    static let grace: Millis = 10_000
    static let chunk = 500

    private var nextRound: Millis = 0
    /// Users of the open round not read yet.
    private var unread: [UserKey] = []
    /// Users whose head was past what was delivered here: the head, and when it was read.
    private var behind: [UserKey: (head: Int64, readAt: Millis)] = [:]

    mutating func run(_ e: Engine, now: Millis) {
        if unread.isEmpty {
            guard now >= nextRound else { return }
            nextRound = now + Self.every
            recoverMissed(e, now: now)
            unread = e.registry.followedUsers
        }
        let part = Array(unread.suffix(Self.chunk))
        unread.removeLast(part.count)
        let heads: [UserKey: Int64]
        do {
            heads = try e.store.heads(part)
        } catch {
            // The next round reads again; the store's health says why.
            e.health.failed("feed audit", error)
            unread.removeAll()
            return
        }
        for (user, head) in heads where behind[user] == nil && head > e.registry.lastDelivered(user) ?? 0 {
            behind[user] = (head, now)
        }
    }

    /// Catches up the followers of users still behind a head read at least
    /// `grace` ago.
    private mutating func recoverMissed(_ e: Engine, now: Millis) {
        for (user, seen) in behind where now - seen.readAt >= Self.grace {
            behind[user] = nil
            guard seen.head > e.registry.lastDelivered(user) ?? 0 else { continue }
            let shards = e.registry.shards(following: user)
            guard !shards.isEmpty else { continue }
            e.metrics.bus.missed.add(1, ordering: .relaxed)
            for shard in shards.map({ e.shards[$0] }) { shard.post { shard.recover(user) } }
            e.registry.caughtUp(user, through: seen.head)
        }
    }
}
