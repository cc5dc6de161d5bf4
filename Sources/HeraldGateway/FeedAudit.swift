import Dispatch
import HeraldCore

/// With a bus: the net under `FollowerRegistry.sequence`, which sees a
/// missed record only when a later one of the same user arrives. A change
/// that committed but never came over the bus (its node died between commit
/// and publish, Redis dropped it, the bus is down) would otherwise reach
/// this node's devices only with the user's next change, perhaps never.
///
/// Every `every`, the engine reads the committed feed heads of the users
/// followed here, spread over the round's first `spread`, and keeps those
/// whose head is past the last seq delivered here. One still behind that
/// head `grace` later missed a change: its followers catch up from the
/// store (docs/ARCHITECTURE.md, "Changes across nodes"). The grace lets
/// records in flight arrive first (the bus, the engine's queue), so a busy
/// node does not read back what is on its way. A change lost at time T is
/// so delivered by T + every + spread + grace + `judgeEvery` (under 20 s).
/// Engine thread only.
struct FeedAudit {
    static let every: Millis = 5_000
    static let spread: Millis = 2_500
    static let grace: Millis = 10_000
    static let judgeEvery: Millis = 1_000
    /// Users read at least per maintenance run while a round lasts.
    static let chunk = 500

    private var roundStart: Millis = 0
    private var roundSize = 0
    private var nextJudge: Millis = 0
    /// Users of the open round not read yet.
    private var unread: [UserKey] = []
    /// Users whose head was past what was delivered here: the highest head
    /// read, and when it was first read so.
    private var behind: [UserKey: (head: Int64, readAt: Millis)] = [:]

    /// `now`: a tick (`Clock.ticks`).
    mutating func run(_ e: Engine, tick now: Millis) {
        if now >= nextJudge {
            nextJudge = now + Self.judgeEvery
            recoverMissed(e, now: now)
        }
        if unread.isEmpty {
            guard now >= roundStart + Self.every else { return }
            roundStart = now
            unread = e.registry.followedUsers
            roundSize = unread.count
        }
        // The round's share due by now, at least a chunk a run.
        let due = roundSize * Int(min(now - roundStart, Self.spread)) / Int(Self.spread)
        let count = min(unread.count, max(Self.chunk, due - (roundSize - unread.count)))
        let part = Array(unread.suffix(count))
        unread.removeLast(count)
        let t0 = DispatchTime.now().uptimeNanoseconds
        defer { e.metrics.maintenanceLatency.observe(nanos: DispatchTime.now().uptimeNanoseconds - t0) }
        let heads: [UserKey: Int64]
        do {
            heads = try e.store.heads(part)
        } catch {
            // The next round reads again; the store's health says why.
            e.health.failed("feed audit", error)
            unread.removeAll()
            return
        }
        for (user, head) in heads where head > e.registry.lastDelivered(user) ?? 0 {
            behind[user] = (max(head, behind[user]?.head ?? 0), behind[user]?.readAt ?? now)
        }
    }

    /// Catches up the followers of users still behind a head read at least
    /// `grace` ago.
    private mutating func recoverMissed(_ e: Engine, now: Millis) {
        for (user, seen) in behind where now - seen.readAt >= Self.grace {
            behind[user] = nil
            guard seen.head > e.registry.lastDelivered(user) ?? 0, !e.registry.shards(following: user).isEmpty else { continue }
            e.metrics.bus.missed.add(1, ordering: .relaxed)
            e.recoverFollowers(of: [user], heads: [user: seen.head])
        }
    }
}
