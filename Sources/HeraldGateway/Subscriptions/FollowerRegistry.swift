import HeraldCore
import HeraldPorts

/// How a device is connected.
public enum TransportKind: String, CaseIterable, Sendable { case websocket, sse, poll }

/// Who follows which user, and which devices are connected: the engine's
/// record, so the engine knows which shards to deliver a user's changes to
/// and the devices listing can say who is connected. Engine thread only:
/// each entry point checks `thread`, the engine's.
///
/// The maps are flat (keyed by user and shard, or user and device) rather
/// than a small dictionary per user: with one device per user, per-user
/// dictionaries cost several hundred bytes of every idle connection.
final class FollowerRegistry {
    /// Per followed user: its followers on all shards, and which shards.
    private var following: [UserKey: Following] = [:]
    /// Followers per user and shard, kept only for users followed on more
    /// than one shard (for the others it is `Following.total`).
    private var perShard: [ShardKey: Int] = [:]
    /// Open connections and recent polls per device, and whether its
    /// lastSeenAt moved since the last flush to the store.
    private var devices: [DeviceKey: DeviceConnections] = [:]
    /// In a cluster (`ClusterConnections`): devices whose connections
    /// changed since they were last recorded for the other nodes; nil on a
    /// single node, which records nothing.
    var presenceDirty: [UserKey: Set<String>]? = nil
    /// With a bus: per followed user, the last seq handed to its shards,
    /// when known (docs/ARCHITECTURE.md, "Changes across nodes").
    private var delivered: [UserKey: Int64] = [:]
    /// With a bus: the followed users, for the bus's thread (any thread): it
    /// decodes only their records. Changed with `following`, before the
    /// admitting batch commits, so a record of a user it leaves out committed
    /// before the user's first follower came, and that follower's catch-up
    /// (or, at worst, the gap check) has it. Without a bus nil: its entry
    /// would cost every idle connection about 80 bytes for nothing.
    let followedForBus: Locked<Set<UserKey>>?
    let thread: ThreadOwner
    /// Follows admitted by the open transaction, taken back if it rolls
    /// back (`revert`); they stand once it commits (`settle`).
    private var provisional: [(Follow, at: Millis)] = []

    init(bus: Bool, thread: ThreadOwner) {
        followedForBus = bus ? Locked([]) : nil
        self.thread = thread
    }

    /// Admits a follower (`Subscription`): from this transaction on, the
    /// user's changes reach `follow.shard`, and the device counts as
    /// connected. The subscription holds what this answers, and gives it
    /// back to `release`, the only undo once the transaction committed.
    func admit(_ follow: Follow, head: Int64?, now: Millis) -> Follow {
        self.follow(follow.user, shard: follow.shard, head: head)
        opened(follow.user, device: follow.device, follow.transport, now: now)
        provisional.append((follow, now))
        return follow
    }

    /// A follower went away.
    func release(_ follow: Follow, now: Millis) {
        unfollow(follow.user, shard: follow.shard)
        closed(follow.user, device: follow.device, follow.transport, now: now)
    }

    /// The transaction that admitted the provisional follows committed.
    func settle() { provisional.removeAll(keepingCapacity: true) }

    /// The transaction that admitted them rolled back: they never were.
    func revert() {
        for (f, at) in provisional.reversed() { release(f, now: at) }
        provisional.removeAll()
    }

    /// Live followers of `user` on every shard.
    func followers(of user: UserKey) -> Int {
        thread.preconditionCurrent()
        return following[user]?.total ?? 0
    }

    func shards(following user: UserKey) -> ShardSet {
        thread.preconditionCurrent()
        return following[user]?.shards ?? ShardSet()
    }

    /// `head`: with a bus, the user's feed head read in the batch that
    /// follows (under the user's lock, so every later change has a larger
    /// seq). For a user no one followed yet it is the last seq delivered:
    /// the next change is then no gap and needs no catch-up from the store.
    func follow(_ user: UserKey, shard: Int, head: Int64? = nil) {
        thread.preconditionCurrent()
        guard var f = following[user] else {
            if let head { delivered[user] = head }
            following[user] = Following(total: 1, shards: ShardSet(shard))
            _ = followedForBus?.withLock { $0.insert(user) }
            return
        }
        if let only = f.onlyShard, only != shard {
            perShard[ShardKey(user: user, shard: only)] = f.total
        }
        if f.onlyShard != shard { perShard[ShardKey(user: user, shard: shard), default: 0] += 1 }
        f.total += 1
        f.shards.insert(shard)
        following[user] = f
    }

    func unfollow(_ user: UserKey, shard: Int) {
        thread.preconditionCurrent()
        guard var f = following[user], f.shards.contains(shard) else { return }
        f.total -= 1
        guard f.total > 0 else {
            following[user] = nil
            delivered[user] = nil
            _ = followedForBus?.withLock { $0.remove(user) }
            return
        }
        if f.onlyShard == nil {
            let key = ShardKey(user: user, shard: shard)
            let n = perShard[key, default: 1] - 1
            perShard[key] = n > 0 ? n : nil
            if n == 0 { f.shards.remove(shard) }
            // Back to one shard: its count is the total again.
            if let only = f.onlyShard { perShard[ShardKey(user: user, shard: only)] = nil }
        }
        following[user] = f
    }

    /// The cross-node ordering invariant: a followed user's records reach
    /// its shards in seq order, each once, and none is skipped unnoticed.
    /// Drops the records at or below the last seq delivered (a duplicate, or
    /// one a catch-up already covered) and says whether some may be missing
    /// before the rest: a seq past the next one (PostgreSQL's seqs per user
    /// are consecutive), or no known last seq. Then
    /// the followers must be caught up from the store, whose
    /// snapshot, read after this record committed, holds what is missing.
    func sequence(_ user: UserKey, _ records: [ChangeRecord]) -> (fresh: [ChangeRecord], gap: Bool) {
        thread.preconditionCurrent()
        var last = delivered[user]
        var gap = last == nil
        let fresh = records.filter { r in
            guard let l = last else { last = r.seq; return true }
            guard r.seq > l else { return false }
            if r.seq > l + 1 { gap = true }
            last = r.seq
            return true
        }
        delivered[user] = last
        return (fresh, gap && !fresh.isEmpty)
    }

    /// Every followed user.
    var followedUsers: [UserKey] {
        thread.preconditionCurrent()
        return Array(following.keys)
    }

    /// The last seq of `user` handed to its shards, when known.
    func lastDelivered(_ user: UserKey) -> Int64? {
        thread.preconditionCurrent()
        return delivered[user]
    }

    /// `user`'s followers are catching up from a store snapshot holding
    /// every change through `head`: records up to it are not delivered again.
    func caughtUp(_ user: UserKey, through head: Int64) {
        thread.preconditionCurrent()
        guard following[user] != nil else { return }
        delivered[user] = max(delivered[user] ?? head, head)
    }

    func opened(_ user: UserKey, device: String?, _ transport: TransportKind, now: Millis) {
        thread.preconditionCurrent()
        guard let device else { return }
        devices[DeviceKey(user: user, device: device), default: DeviceConnections()].open(transport, now: now)
        presenceDirty?[user, default: []].insert(device)
    }

    func closed(_ user: UserKey, device: String?, _ transport: TransportKind, now: Millis) {
        thread.preconditionCurrent()
        guard let device else { return }
        let key = DeviceKey(user: user, device: device)
        guard devices[key] != nil else { return }
        devices[key]!.close(transport, now: now)
        presenceDirty?[user, default: []].insert(device)
    }

    /// A poll that was answered at once: the device shows as `poll` for 60 s.
    func polled(_ user: UserKey, device: String?, now: Millis) {
        thread.preconditionCurrent()
        guard let device else { return }
        devices[DeviceKey(user: user, device: device), default: DeviceConnections()].lastPollAt = now
        seen(user, device: device, at: now)
        presenceDirty?[user, default: []].insert(device)
    }

    func seen(_ user: UserKey, device: String, at: Millis) {
        thread.preconditionCurrent()
        devices[DeviceKey(user: user, device: device), default: DeviceConnections()].seen(at: at)
    }

    /// The devices whose lastSeenAt moved since the last flush, by user.
    var unsavedSeen: [UserKey: Set<String>] {
        thread.preconditionCurrent()
        var out: [UserKey: Set<String>] = [:]
        for (key, c) in devices where c.unsaved { out[key.user, default: []].insert(key.device) }
        return out
    }

    func connections(_ user: UserKey, device: String) -> DeviceConnections? {
        thread.preconditionCurrent()
        return devices[DeviceKey(user: user, device: device)]
    }

    /// After a flush of lastSeenAt to the store: forgets the devices with
    /// nothing open and no poll within the listing's minute, so the map
    /// holds connected devices, not every device ever seen. Answers what
    /// undoes it, for a flush whose transaction rolls back (it runs again).
    @discardableResult func flushed(now: Millis) -> () -> Void {
        thread.preconditionCurrent()
        let before = devices
        devices = devices.compactMapValues { c in
            guard c.transport(now: now) != nil else { return nil }
            var saved = c
            saved.unsaved = false
            return saved
        }
        return { self.devices = before }
    }

    var knownDevices: Int {
        thread.preconditionCurrent()
        return devices.count
    }

    /// Every device with a connection or a recent poll.
    var connectedDevices: [UserKey: Set<String>] {
        thread.preconditionCurrent()
        var out: [UserKey: Set<String>] = [:]
        for key in devices.keys { out[key.user, default: []].insert(key.device) }
        return out
    }
}

/// A subscription's follow of its user's feed, from one shard
/// (`FollowerRegistry.admit`).
struct Follow: Sendable {
    let user: UserKey
    let shard: Int
    let device: String?
    let transport: TransportKind
}

/// A device of a user.
struct DeviceKey: Hashable {
    let user: UserKey
    let device: String
}

private struct ShardKey: Hashable {
    let user: UserKey
    let shard: Int
}

private struct Following {
    var total: Int
    var shards: ShardSet
    /// The shard, when every follower is on one.
    var onlyShard: Int? { shards.only }
}

/// A set of shard indexes, as bits: a gateway has at most 64 shards (one per
/// service loop; `--threads` is 1–64).
struct ShardSet: Sequence {
    private var bits: UInt64 = 0

    init() {}
    init(_ shard: Int) { insert(shard) }

    var isEmpty: Bool { bits == 0 }
    func contains(_ shard: Int) -> Bool { shard >= 0 && shard < 64 && bits & (1 << UInt64(shard)) != 0 }
    /// The one shard in the set, if it holds exactly one.
    var only: Int? { bits != 0 && bits & (bits - 1) == 0 ? bits.trailingZeroBitCount : nil }
    mutating func insert(_ shard: Int) {
        precondition(shard >= 0 && shard < 64, "at most 64 shards")
        bits |= 1 << UInt64(shard)
    }
    mutating func remove(_ shard: Int) { bits &= ~(1 << UInt64(shard)) }

    func makeIterator() -> Iterator { Iterator(rest: bits) }

    struct Iterator: IteratorProtocol {
        var rest: UInt64
        mutating func next() -> Int? {
            guard rest != 0 else { return nil }
            let shard = rest.trailingZeroBitCount
            rest &= rest - 1
            return shard
        }
    }
}

/// A device's open connections, as the devices listing shows them.
struct DeviceConnections {
    // 32-bit counts: 32 bytes an entry (one per connected device), not 40.
    var websocket: Int32 = 0
    var sse: Int32 = 0
    var heldPolls: Int32 = 0
    /// lastSeenAt moved since the last flush to the store.
    var unsaved = false
    var lastPollAt: Millis = 0
    var lastSeenAt: Millis = 0

    mutating func seen(at: Millis) {
        lastSeenAt = at
        unsaved = true
    }

    mutating func open(_ t: TransportKind, now: Millis) {
        switch t {
        case .websocket: websocket += 1
        case .sse: sse += 1
        case .poll: heldPolls += 1; lastPollAt = now
        }
        lastSeenAt = now
    }

    mutating func close(_ t: TransportKind, now: Millis) {
        switch t {
        case .websocket: websocket -= 1
        case .sse: sse -= 1
        case .poll: heldPolls -= 1; lastPollAt = now
        }
        seen(at: now)
    }

    /// SPEC section 3: the transport a device listing shows.
    func transport(now: Millis) -> TransportKind? {
        if websocket > 0 { return .websocket }
        if sse > 0 { return .sse }
        if heldPolls > 0 || (lastPollAt > 0 && now - lastPollAt <= 60_000) { return .poll }
        return nil
    }
}
