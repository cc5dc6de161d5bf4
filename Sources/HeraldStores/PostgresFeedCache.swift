import HeraldCore

/// What this node last knew of users' feeds as committed: each user's head,
/// and the notifications that transactions of this node wrote, or that
/// other nodes' changes (from the bus) brought, at that head. A batch whose
/// users and lookups are all known here claims them without reading
/// (`PostgresStore.claim`): it costs one round trip, its COMMIT, not two.
///
/// Another node may have moved a feed meanwhile, so a head from here is a
/// claim that the batch's transaction checks under the user's lock
/// (`herald_expect_heads`, which fails the transaction as a conflict; the
/// engine runs it again, reading). Every change to a user's notifications
/// moves the user's head, so an unchanged head vouches for every
/// notification known at it. Entries come only from committed transactions
/// and from changes other nodes committed, and the users of a transaction
/// that failed are forgotten: a head never goes with notifications of
/// another state of the feed.
///
/// Bounded by `budget` (bytes of encoded changes, roughly); past it, the
/// users used least recently go. The store's owner's thread only.
struct PostgresFeedCache {
    private struct Entry {
        var head: Int64
        /// The notifications live at `head`. A lookup missing here is not
        /// known (the batch reads), also once deleted: a deleted
        /// notification kept as "none" would weigh nothing against the
        /// budget, and a node whose notifications all expire in time would
        /// grow without bound.
        var known: [NotificationLookup: (notification: Notification, weight: Int)] = [:]
        /// The user's preferences at `head`, when known (a save moves the
        /// head like any change, so the head vouches for them too).
        var preferences: Preferences?
        var weight = Self.baseWeight
        var used: UInt64 = 0

        /// A user's head and key: what an entry weighs with nothing known.
        static let baseWeight = 256

        init(head: Int64) { self.head = head }

        /// Takes in `r`, the change right after `head`.
        mutating func apply(_ user: UserKey, _ r: ChangeRecord) {
            switch r.change.op {
            case .upsert(let n):
                set(.id(user, n.id), n, r.encoded.count)
                set(.appNotificationId(user, n.appNotificationId), n, r.encoded.count)
            case .delete(let id, let appNotificationId, _):
                unset(.id(user, id))
                unset(.appNotificationId(user, appNotificationId))
            case .preferences(let p):
                know(p.with(critical: []))
            }
            head = r.seq
        }

        /// About what `p` takes in memory.
        mutating func know(_ p: Preferences) {
            weight += Self.weight(p) - (preferences.map(Self.weight) ?? 0)
            preferences = p
        }

        private static func weight(_ p: Preferences) -> Int { 64 + 64 * p.groups.count }

        private mutating func set(_ l: NotificationLookup, _ n: Notification, _ w: Int) {
            weight += w - (known.updateValue((n, w), forKey: l)?.weight ?? 0)
        }

        private mutating func unset(_ l: NotificationLookup) {
            weight -= known.removeValue(forKey: l)?.weight ?? 0
        }
    }

    private var entries: [UserKey: Entry] = [:]
    private var weight = 0
    private var tick: UInt64 = 0
    let budget: Int

    init(budget: Int) { self.budget = budget }

    /// Users known here.
    var count: Int { entries.count }

    /// Lookups known here, of all users.
    var lookups: Int { entries.values.reduce(0) { $0 + $1.known.count } }

    /// The head known for `user`.
    func head(_ user: UserKey) -> Int64? { entries[user]?.head }

    /// The heads of `users` and what `lookups` find, or nil unless all are
    /// known. A lookup of a user not among `users` (locked earlier in the
    /// transaction, at `lockedAt`) is answered only if the entry is of
    /// that same head.
    mutating func serve(_ users: Set<UserKey>, _ lookups: [NotificationLookup],
                        lockedAt: [UserKey: Int64]) -> (heads: [UserKey: Int64], known: [NotificationLookup: Notification?])? {
        var heads: [UserKey: Int64] = [:], known: [NotificationLookup: Notification?] = [:]
        for u in users {
            guard let e = entries[u] else { return nil }
            heads[u] = e.head
        }
        for l in lookups {
            guard let e = entries[l.user], users.contains(l.user) || lockedAt[l.user] == e.head,
                  let k = e.known[l] else { return nil }
            known.updateValue(k.notification, forKey: l)
        }
        tick += 1
        for u in users.union(lookups.map(\.user)) { entries[u]?.used = tick }
        return (heads, known)
    }

    /// The preferences known for `user` at `head`.
    func preferences(_ user: UserKey, at head: Int64) -> Preferences? {
        guard let e = entries[user], e.head == head else { return nil }
        return e.preferences
    }

    /// `user`'s feed was at `head` (read or checked under its lock) and then
    /// took `records`, committed: this node's own transaction, which ended
    /// with `preferences` when it read or saved them.
    mutating func committed(_ user: UserKey, from head: Int64, _ records: [ChangeRecord], preferences: Preferences? = nil) {
        update(user) { e in
            if e?.head != head { e = Entry(head: head) }
            for r in records { Self.advance(&e, user, r) }
            if let preferences { e?.know(preferences) }
        }
    }

    /// Changes of `user` that another node committed, in seq order.
    mutating func heard(_ user: UserKey, _ records: [ChangeRecord]) {
        update(user) { e in
            for r in records { Self.advance(&e, user, r) }
        }
    }

    /// Takes `r` into `e`, unless `e` is past it already. After a gap only
    /// what `r` says is known (seqs of one user are consecutive here).
    private static func advance(_ e: inout Entry?, _ user: UserKey, _ r: ChangeRecord) {
        if let head = e?.head, r.seq <= head { return }
        if e?.head != r.seq - 1 { e = Entry(head: r.seq - 1) }
        e?.apply(user, r)
    }

    mutating func forget<S: Sequence>(_ users: S) where S.Element == UserKey {
        for u in users { if let e = entries.removeValue(forKey: u) { weight -= e.weight } }
    }

    mutating func forgetAll() {
        entries.removeAll()
        weight = 0
    }

    private mutating func update(_ user: UserKey, _ body: (inout Entry?) -> Void) {
        var e = entries.removeValue(forKey: user)
        weight -= e?.weight ?? 0
        body(&e)
        guard var e else { return }
        tick += 1
        e.used = tick
        weight += e.weight
        entries[user] = e
        if weight > budget { shed() }
    }

    /// Drops the users used least recently, down to three quarters of the
    /// budget: a sort now and then, not bookkeeping on every use.
    private mutating func shed() {
        for (u, _) in entries.sorted(by: { $0.value.used < $1.value.used }) {
            guard weight > budget / 4 * 3 else { return }
            forget([u])
        }
    }
}
