import HeraldCore
import HeraldPorts

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
/// The heads are read on the store's reader thread (`Engine.readAside`).
/// Engine thread only.
final class FeedAudit {
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
    /// A read of heads is out on the reader thread.
    private var reading = false

    /// `now`: a tick (`Clock.ticks`).
    func run(_ e: Engine, tick now: Millis) {
        if now >= nextJudge {
            nextJudge = now + Self.judgeEvery
            recoverMissed(e, now: now)
        }
        guard !reading else { return }
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
        reading = true
        e.readAside({ r throws(StoreError) in try r.heads(part) }) { e, heads in e.maintenance.audit.read(heads, e) }
    }

    /// Notes the users whose head read is past what was delivered here, as
    /// of now (the reply's arrival: the grace runs from no earlier than the
    /// read).
    private func read(_ heads: Result<[UserKey: Int64], StoreError>, _ e: Engine) {
        reading = false
        switch heads {
        case .success(let heads):
            let now = e.clock.ticks()
            for (user, head) in heads where head > e.registry.lastDelivered(user) ?? 0 {
                behind[user] = (max(head, behind[user]?.head ?? 0), behind[user]?.readAt ?? now)
            }
        case .failure(let error):
            // The next round reads again; the store's health says why.
            e.health.failed(.read, "feed audit", error)
            unread.removeAll()
        }
    }

    /// Catches up the followers of users still behind a head read at least
    /// `grace` ago.
    private func recoverMissed(_ e: Engine, now: Millis) {
        for (user, seen) in behind where now - seen.readAt >= Self.grace {
            behind[user] = nil
            guard seen.head > e.registry.lastDelivered(user) ?? 0, !e.registry.shards(following: user).isEmpty else { continue }
            e.metrics.bus.missed.add(1, ordering: .relaxed)
            e.recoverFollowers(of: [user], heads: [user: seen.head])
        }
    }
}
