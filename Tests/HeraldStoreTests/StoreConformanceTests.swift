import Foundation
import XCTest
import HeraldTestSupport
import HeraldCore
@testable import HeraldStores

typealias Notification = HeraldCore.Notification

/// The one store conformance suite: written against `NotificationStore`
/// only, run for every implementation by a subclass that overrides
/// `makeStore()` and lists every check as a test method.
///
/// Why the list: on Linux, XCTest discovers only the test methods a class
/// declares itself, not inherited ones, so the checks are named `check…`
/// here and each store's subclass forwards `test…` to them: a new check
/// must be forwarded by every subclass.
class StoreConformanceTests: XCTestCase {
    /// A fresh, empty store; nil in the abstract base class.
    func makeStore() throws -> NotificationStore? { nil }

    var store: NotificationStore!

    override func setUpWithError() throws {
        guard let s = try makeStore() else { throw XCTSkip("abstract conformance suite") }
        store = s
    }

    override func tearDown() {
        store = nil
        super.tearDown()
    }

    // MARK: Fixtures

    let alice = UserKey(app: "app1", user: "alice")
    let bob = UserKey(app: "app1", user: "bob")
    let aliceInApp2 = UserKey(app: "app2", user: "alice")

    static let t0: Millis = 1_800_000_000_000
    static let day: Millis = 86_400_000

    func note(_ id: String, _ anid: String, user: UserKey? = nil, createdAt: Millis = t0,
              expiresAt: Millis? = nil, payload: JSONObject = ["title": "hi"],
              platforms: [Platform]? = nil, tags: String? = nil, version: Int64 = 1) -> Notification {
        Notification(id: id, appNotificationId: anid, userId: (user ?? alice).user, payload: payload,
                     targetPlatforms: platforms, targetTags: tags.flatMap { try? TagExpression.parse($0) },
                     createdAt: createdAt, updatedAt: createdAt, expiresAt: expiresAt ?? createdAt + 30 * Self.day,
                     version: version)
    }

    @discardableResult
    func publish(_ user: UserKey, _ n: Notification, at: Millis? = nil) throws -> ChangeRecord {
        let previous = try store.notification(user, id: n.id)
        return try store.upsert(user, n, previous: previous, at: at ?? n.updatedAt)
    }

    func assertSame(_ a: ChangeRecord, _ b: ChangeRecord, file: StaticString = #filePath, line: UInt = #line) {
        XCTAssertEqual(a.change, b.change, file: file, line: line)
        XCTAssertEqual(a.before, b.before, file: file, line: line)
        XCTAssertEqual(a.after, b.after, file: file, line: line)
        XCTAssertEqual(a.at, b.at, file: file, line: line)
        XCTAssertEqual(a.encoded, b.encoded, file: file, line: line)
    }

    // MARK: Seq

    func checkSeqStrictlyIncreasingPerUserAndIndependent() throws {
        XCTAssertEqual(try store.feed(alice), FeedState(head: 0, floor: 0))
        XCTAssertTrue(try store.feed(alice).accepts(cursor: 0))
        var last: [UserKey: Int64] = [:]
        let users = [alice, bob, aliceInApp2, alice, alice, bob, aliceInApp2, alice]
        for (k, u) in users.enumerated() {
            let r = try publish(u, note("n_\(k)", "a\(k)", user: u))
            XCTAssertGreaterThan(r.seq, last[u] ?? 0, "seq must strictly increase for \(u)")
            last[u] = r.seq
            XCTAssertEqual(try store.feed(u).head, r.seq)
        }
        // Independent feeds: each starts from its own beginning.
        XCTAssertEqual(try store.changes(alice, after: 0, limit: 100).count, 4)
        XCTAssertEqual(try store.changes(bob, after: 0, limit: 100).count, 2)
        XCTAssertEqual(try store.changes(aliceInApp2, after: 0, limit: 100).count, 2)
        XCTAssertEqual(try store.changes(bob, after: 0, limit: 100).first?.seq, 1)
        XCTAssertEqual(try store.changes(aliceInApp2, after: 0, limit: 100).first?.seq, 1)
        // Deletes take seqs too.
        let n = try XCTUnwrap(store.notification(alice, id: "n_0"))
        let d = try store.delete(alice, n, reason: .deleted, at: Self.t0 + 1)
        XCTAssertGreaterThan(d.seq, last[alice]!)
        XCTAssertEqual(try store.feed(alice).head, d.seq)
    }

    // MARK: Upsert and lookup

    func checkUpsertNewAndReplace() throws {
        let n1 = note("n_1", "task-42", payload: ["title": "one", "nested": ["a": [1, .number("2.50"), .number("-1e3"), "x\u{1}é\"\\"], "b": nil, "c": true]],
                      platforms: [.web, .ios], tags: "lang:it && !muted")
        let r1 = try publish(alice, n1)
        XCTAssertNil(r1.before)
        XCTAssertEqual(r1.after, Presence(n1))
        XCTAssertEqual(r1.change, Change(seq: r1.seq, op: .upsert(n1)))
        XCTAssertEqual(try store.notification(alice, id: "n_1"), n1)
        XCTAssertEqual(try store.notification(alice, appNotificationId: "task-42"), n1)

        var n2 = note("n_1", "task-42", createdAt: Self.t0, payload: ["title": "two"], version: 2)
        n2.updatedAt = Self.t0 + 5000
        n2.readState = .read
        n2.userActionState = .dismissed
        let r2 = try publish(alice, n2)
        XCTAssertGreaterThan(r2.seq, r1.seq)
        XCTAssertEqual(r2.before, Presence(n1))
        XCTAssertEqual(r2.after, Presence(n2))
        XCTAssertEqual(r2.at, Self.t0 + 5000)
        XCTAssertEqual(try store.notification(alice, id: "n_1"), n2)
        XCTAssertEqual(try store.notification(alice, appNotificationId: "task-42"), n2)
        XCTAssertEqual(try store.history(alice, after: nil, limit: 10), [n2], "a replace is not a second notification")

        // What the feed returns is what upsert returned.
        let feed = try store.changes(alice, after: 0, limit: 10)
        XCTAssertEqual(feed.count, 2)
        assertSame(feed[0], r1)
        assertSame(feed[1], r2)
    }

    func checkLookupMisses() throws {
        try publish(alice, note("n_1", "task-1"))
        XCTAssertNil(try store.notification(alice, id: "n_2"))
        XCTAssertNil(try store.notification(alice, appNotificationId: "task-2"))
        XCTAssertNil(try store.notification(bob, id: "n_1"), "another user's notification")
        XCTAssertNil(try store.notification(bob, appNotificationId: "task-1"))
        XCTAssertNil(try store.notification(aliceInApp2, id: "n_1"), "another app's notification")
        XCTAssertNil(try store.notification(aliceInApp2, appNotificationId: "task-1"))
        // The same appNotificationId is independent per user.
        try publish(bob, note("n_9", "task-1", user: bob))
        XCTAssertEqual(try store.notification(bob, appNotificationId: "task-1")?.id, "n_9")
        XCTAssertEqual(try store.notification(alice, appNotificationId: "task-1")?.id, "n_1")
    }

    // MARK: Delete

    func checkDeleteKeepsTombstone() throws {
        let n = note("n_1", "task-1", platforms: [.android], tags: "a")
        let up = try publish(alice, n)
        let del = try store.delete(alice, n, reason: .deleted, at: Self.t0 + 10)
        XCTAssertGreaterThan(del.seq, up.seq)
        XCTAssertEqual(del.change, Change(seq: del.seq, op: .delete(id: "n_1", appNotificationId: "task-1", reason: .deleted)))
        XCTAssertEqual(del.before, Presence(n))
        XCTAssertNil(del.after)
        XCTAssertNil(try store.notification(alice, id: "n_1"))
        XCTAssertNil(try store.notification(alice, appNotificationId: "task-1"))
        XCTAssertEqual(try store.history(alice, after: nil, limit: 10), [])

        let feed = try store.changes(alice, after: 0, limit: 10)
        XCTAssertEqual(feed.map(\.seq), [up.seq, del.seq])
        assertSame(feed[1], del)

        // The appNotificationId is free again: a new notification takes it.
        let again = note("n_2", "task-1")
        try publish(alice, again)
        XCTAssertEqual(try store.notification(alice, appNotificationId: "task-1"), again)

        // Expiry deletes read back with their reason.
        let ex = try store.delete(alice, again, reason: .expired, at: Self.t0 + 20)
        let last = try XCTUnwrap(store.changes(alice, after: ex.seq - 1, limit: 10).first)
        XCTAssertEqual(last.change, Change(seq: ex.seq, op: .delete(id: "n_2", appNotificationId: "task-1", reason: .expired)))
    }

    // MARK: Changes after a cursor

    func checkChangesOrderAndBounds() throws {
        var records: [ChangeRecord] = []
        for k in 0..<10 {
            records.append(try publish(alice, note("n_\(k)", "t\(k)", createdAt: Self.t0 + Millis(k))))
            try publish(bob, note("n_b\(k)", "t\(k)", user: bob))
        }
        let seqs = records.map(\.seq)
        XCTAssertEqual(try store.changes(alice, after: 0, limit: 100).map(\.seq), seqs)
        XCTAssertEqual(try store.changes(alice, after: seqs[2], limit: 4).map(\.seq), Array(seqs[3..<7]))
        XCTAssertEqual(try store.changes(alice, after: seqs[8], limit: 4).map(\.seq), [seqs[9]])
        XCTAssertEqual(try store.changes(alice, after: seqs[9], limit: 4).map(\.seq), [])
        XCTAssertEqual(try store.changes(alice, after: seqs[9] + 100, limit: 4).map(\.seq), [])
        XCTAssertEqual(try store.changes(alice, after: 0, limit: 0).count, 0)
        XCTAssertEqual(try store.changes(UserKey(app: "app1", user: "nobody"), after: 0, limit: 10).count, 0)
        for (a, b) in zip(try store.changes(alice, after: 0, limit: 100), records) { assertSame(a, b) }
    }

    // MARK: History

    /// Ids as the gateway makes them, of their `createdAt` and counting up
    /// within a millisecond: a store may read history in id order
    /// (`NotificationStore.history`).
    func notes(at times: [Millis], user: UserKey? = nil) -> [Notification] {
        times.enumerated().map { k, at in note(NotificationID.make(now: at), "a\(k)", user: user, createdAt: at) }
    }

    func checkHistoryOrderWithTiesAndPaging() throws {
        let t = Self.t0
        let ns = notes(at: [t, t, t, t + 1, t - 1, t + 1])
        for n in ns.shuffled() { try publish(alice, n) }
        try publish(bob, note(NotificationID.make(now: t), "x", user: bob, createdAt: t))
        // Equal createdAt: higher id first, the one made later.
        let expected = [ns[3], ns[5]].map(\.id).sorted(by: >) + [ns[2], ns[1], ns[0], ns[4]].map(\.id)
        XCTAssertEqual(try store.history(alice, after: nil, limit: 50).map(\.id), expected)
        XCTAssertEqual(ns.sorted { HistoryKey($0) < HistoryKey($1) }.map(\.id), expected, "HistoryKey agrees")

        // Paging with `after:` the last key of each page.
        var got: [String] = []
        var after: HistoryKey? = nil
        while true {
            let page = try store.history(alice, after: after, limit: 2)
            got += page.map(\.id)
            guard page.count == 2, let last = page.last else { break }
            after = HistoryKey(last)
        }
        XCTAssertEqual(got, expected)
        XCTAssertEqual(try store.history(alice, after: nil, limit: 0), [])
        XCTAssertEqual(try store.history(alice, after: HistoryKey(ns[4]), limit: 5), [])
        // Positions whose id is of another millisecond than their createdAt
        // (a page token is the client's): the createdAt orders first.
        XCTAssertEqual(try store.history(alice, after: HistoryKey(createdAt: t, id: ns[4].id), limit: 9).map(\.id), [ns[4].id])
        XCTAssertEqual(try store.history(alice, after: HistoryKey(createdAt: t, id: ns[3].id), limit: 9).map(\.id),
                       Array(expected.dropFirst(2)))
        XCTAssertEqual(try store.history(alice, after: HistoryKey(createdAt: .max, id: ns[0].id), limit: 9).map(\.id), expected)
        XCTAssertEqual(try store.history(alice, after: HistoryKey(createdAt: .min, id: ns[3].id), limit: 9), [])
    }

    func checkHistoryPagingAfterDeletedKey() throws {
        let t = Self.t0
        let ns = notes(at: (0..<6).map { t + Millis($0 / 2) })
        for n in ns { try publish(alice, n) }
        // Order: ns[5], ns[4], ns[3], ns[2], ns[1], ns[0]
        let page1 = try store.history(alice, after: nil, limit: 3)
        XCTAssertEqual(page1.map(\.id), [ns[5], ns[4], ns[3]].map(\.id))
        // The key the next page starts after is deleted meanwhile, and so is
        // its neighbour with the same createdAt.
        _ = try store.delete(alice, page1[2], reason: .deleted, at: t + 100)
        _ = try store.delete(alice, ns[2], reason: .deleted, at: t + 101)
        let page2 = try store.history(alice, after: HistoryKey(page1[2]), limit: 3)
        XCTAssertEqual(page2.map(\.id), [ns[1], ns[0]].map(\.id))
        // A key that never existed works as a position too: between ns[5] and ns[4].
        XCTAssertEqual(try store.history(alice, after: HistoryKey(createdAt: t + 2, id: ns[4].id + "0"), limit: 10).map(\.id),
                       [ns[4], ns[1], ns[0]].map(\.id))
    }

    // MARK: Expiry

    func checkExpiring() throws {
        let t = Self.t0
        XCTAssertNil(try store.next(.expiry), "nothing stored, nothing to sweep")
        try publish(alice, note("n_1", "a", expiresAt: t + 300))
        try publish(bob, note("n_2", "b", user: bob, expiresAt: t + 100))
        try publish(aliceInApp2, note("n_3", "c", user: aliceInApp2, expiresAt: t + 200))
        try publish(alice, note("n_4", "d", expiresAt: t + 1000))
        XCTAssertEqual(try store.next(.expiry), t + 100)
        if let reader = try store.makeReader() { XCTAssertEqual(try reader.next(.expiry), t + 100, "the reader sees it too") }

        XCTAssertEqual(try store.due(.expiry, until: t + 50, limit: 10).count, 0)
        let due = try store.due(.expiry, until: t + 300, limit: 10)
        XCTAssertEqual(due.map(\.1.id), ["n_2", "n_3", "n_1"], "oldest expiry first")
        XCTAssertEqual(due.map(\.0), [bob, aliceInApp2, alice])
        XCTAssertEqual(try store.due(.expiry, until: t + 300, limit: 2).map(\.1.id), ["n_2", "n_3"])
        // Still due until deleted.
        XCTAssertEqual(try store.due(.expiry, until: t + 300, limit: 2).map(\.1.id), ["n_2", "n_3"])

        for (u, n) in due { _ = try store.delete(u, n, reason: .expired, at: t + 300) }
        XCTAssertEqual(try store.due(.expiry, until: t + 300, limit: 10).count, 0)

        // A replace moves the expiry.
        var n4 = try XCTUnwrap(store.notification(alice, id: "n_4"))
        n4.expiresAt = t + 400
        n4.version += 1
        try publish(alice, n4)
        XCTAssertEqual(try store.due(.expiry, until: t + 500, limit: 10).map(\.1), [n4])
        XCTAssertEqual(try store.due(.expiry, until: t + 500, limit: 0).count, 0)
        // Early is allowed (a memory store's stale entries), late never.
        XCTAssertLessThanOrEqual(try XCTUnwrap(store.next(.expiry)), t + 400)
    }

    /// Snoozes that end are swept like expiry (SPEC section 11): only
    /// notifications snoozed until a time, earliest first, until changed.
    func checkWaking() throws {
        let t = Self.t0
        XCTAssertNil(try store.next(.wake), "nothing stored, nothing to wake")
        func snoozed(_ id: String, _ anid: String, user: UserKey = alice, until: Millis?) -> Notification {
            var n = note(id, anid, user: user)
            n.userActionState = .snoozed
            n.snoozedUntil = until
            return n
        }
        try publish(alice, snoozed("n_1", "a", until: t + 300))
        try publish(bob, snoozed("n_2", "b", user: bob, until: t + 100))
        try publish(alice, snoozed("n_3", "c", until: nil))
        try publish(alice, note("n_4", "d"))
        XCTAssertEqual(try store.next(.wake), t + 100)
        if let reader = try store.makeReader() { XCTAssertEqual(try reader.next(.wake), t + 100, "the reader sees it too") }
        XCTAssertEqual(try store.due(.wake, until: t + 50, limit: 10).count, 0)
        let due = try store.due(.wake, until: .max, limit: 10)
        XCTAssertEqual(due.map(\.1.id), ["n_2", "n_1"], "earliest first; none without a time")
        XCTAssertEqual(due.map(\.1.snoozedUntil), [t + 100, t + 300], "read back with its time")
        XCTAssertEqual(try store.due(.wake, until: .max, limit: 1).map(\.1.id), ["n_2"])
        // Woken, it is due no more; the other stays.
        let n2 = due[0].1
        _ = try store.upsert(bob, n2.woken(at: t + 100), previous: n2, at: t + 100)
        XCTAssertEqual(try store.due(.wake, until: .max, limit: 10).map(\.1.id), ["n_1"])
        XCTAssertNil(try XCTUnwrap(store.notification(bob, id: "n_2")).snoozedUntil)
        // A deleted one is due no more; early is allowed, late never.
        _ = try store.delete(alice, due[1].1, reason: .deleted, at: t + 200)
        XCTAssertEqual(try store.due(.wake, until: .max, limit: 10).count, 0)
        if let next = try store.next(.wake) { XCTAssertLessThanOrEqual(next, t + 300) }
    }

    // MARK: Retention

    func checkPruneChangesRaisesFloor() throws {
        let t = Self.t0
        var seqs: [Int64] = []
        for k in 0..<4 { seqs.append(try publish(alice, note("n_\(k)", "t\(k)"), at: t + Millis(k) * 100).seq) }
        let bobSeq = try publish(bob, note("n_b", "b", user: bob), at: t + 1000).seq
        // One notification changed again, so an older change of it goes too.
        var n1 = try XCTUnwrap(store.notification(alice, id: "n_1"))
        n1.readState = .read
        n1.version += 1
        seqs.append(try publish(alice, n1, at: t + 300).seq)
        let kept = try store.history(alice, after: nil, limit: 10)

        XCTAssertEqual(try store.pruneChanges(before: t), 0)
        XCTAssertEqual(try store.pruneChanges(before: t + 150), 2)  // at t and t+100
        let feed = try store.feed(alice)
        XCTAssertEqual(feed, FeedState(head: seqs[4], floor: seqs[1]))
        XCTAssertEqual(try store.changes(alice, after: 0, limit: 10).map(\.seq), [seqs[2], seqs[3], seqs[4]])
        XCTAssertFalse(feed.accepts(cursor: 0), "a cursor before the floor may have missed pruned changes")
        XCTAssertFalse(feed.accepts(cursor: seqs[0]))
        XCTAssertTrue(feed.accepts(cursor: seqs[1]))
        XCTAssertTrue(feed.accepts(cursor: seqs[4]))
        XCTAssertFalse(feed.accepts(cursor: seqs[4] + 1), "ahead of the feed")
        XCTAssertEqual(try store.feed(bob), FeedState(head: bobSeq, floor: 0), "other feeds untouched")
        try assertNotificationsKept(kept)

        // Prune everything: floor reaches head, seq continues after it.
        XCTAssertEqual(try store.pruneChanges(before: t + 10_000), 4)
        XCTAssertEqual(try store.feed(alice), FeedState(head: seqs[4], floor: seqs[4]))
        XCTAssertEqual(try store.feed(bob), FeedState(head: bobSeq, floor: bobSeq))
        XCTAssertTrue(try store.feed(alice).accepts(cursor: seqs[4]))
        try assertNotificationsKept(kept)
        XCTAssertEqual(try store.notification(bob, id: "n_b"), note("n_b", "b", user: bob))
        let next = try publish(alice, note("n_9", "t9"), at: t + 20_000)
        XCTAssertGreaterThan(next.seq, seqs[4])
        XCTAssertEqual(try store.changes(alice, after: seqs[4], limit: 10).map(\.seq), [next.seq])
        XCTAssertEqual(try store.pruneChanges(before: t + 10_000), 0)
        // A notification kept through a prune changes and is deleted as any other.
        n1.userActionState = .dismissed
        n1.version += 1
        _ = try publish(alice, n1, at: t + 20_001)
        XCTAssertEqual(try store.notification(alice, id: "n_1"), n1)
        _ = try store.delete(alice, try XCTUnwrap(store.notification(alice, id: "n_2")), reason: .deleted, at: t + 20_002)
        XCTAssertEqual(try store.history(alice, after: nil, limit: 10).map(\.id).sorted(), ["n_0", "n_1", "n_3", "n_9"])
        XCTAssertEqual(try store.counts(alice).reduce(0) { $0 + $1.unread }, 3)
    }

    /// A prune limited to a few changes a call gets through a backlog in
    /// several calls, and ends where one unlimited call would.
    func checkPruneChangesInLimitedCalls() throws {
        let t = Self.t0
        // alice: two changes at one instant, then one each 100 ms apart, and
        // one notification changed again; bob: two changes between hers.
        var aliceSeqs = [try publish(alice, note("n_0", "t0"), at: t).seq, try publish(alice, note("n_1", "t1"), at: t).seq]
        let bobSeqs = [try publish(bob, note("n_b0", "b0", user: bob), at: t + 50).seq,
                       try publish(bob, note("n_b1", "b1", user: bob), at: t + 150).seq]
        for k in 2..<5 { aliceSeqs.append(try publish(alice, note("n_\(k)", "t\(k)"), at: t + Millis(k - 1) * 100).seq) }
        var n0 = try XCTUnwrap(store.notification(alice, id: "n_0"))
        n0.readState = .read
        n0.version += 1
        aliceSeqs.append(try publish(alice, n0, at: t + 400).seq)
        // Three at one instant, more than a call's limit: they still go.
        for k in 5..<8 { aliceSeqs.append(try publish(alice, note("n_\(k)", "t\(k)"), at: t + 500).seq) }
        // A send to twenty users writes their changes at one instant: still
        // a few per call, not all twenty at once.
        let bulk = (0..<20).map { UserKey(app: "app1", user: "bulk\($0)") }
        let bulkSeqs = try bulk.map { u in try publish(u, note("n_\(u.user)", "b", user: u), at: t + 600).seq }
        let kept = try store.history(alice, after: nil, limit: 20)
        let recent = try publish(alice, note("n_9", "t9"), at: t + 5_000)

        var calls: [Pruned] = []
        repeat {
            calls.append(try store.pruneChanges(before: t + 1_000, limit: 2))
        } while calls.last!.more && calls.count < 40
        XCTAssertFalse(calls.last!.more, "the calls come to an end")
        XCTAssertEqual(calls.first, Pruned(changes: 2, more: true), "the first call stops at its limit")
        // At most the limit; PostgreSQL may take all of one user's changes at one instant (alice's three).
        XCTAssertTrue(calls.allSatisfy { $0.changes <= 3 }, "\(calls)")
        let total = aliceSeqs.count + bobSeqs.count + bulk.count
        XCTAssertGreaterThanOrEqual(calls.count, (total + 2) / 3, "\(calls)")
        XCTAssertEqual(calls.reduce(0) { $0 + $1.changes }, total, "\(calls)")
        for (u, seq) in zip(bulk, bulkSeqs) { XCTAssertEqual(try store.feed(u), FeedState(head: seq, floor: seq), u.user) }
        XCTAssertEqual(try store.feed(alice), FeedState(head: recent.seq, floor: aliceSeqs.last!))
        XCTAssertEqual(try store.feed(bob), FeedState(head: bobSeqs[1], floor: bobSeqs[1]))
        XCTAssertEqual(try store.changes(alice, after: aliceSeqs.last!, limit: 10).map(\.seq), [recent.seq])
        XCTAssertEqual(try store.history(alice, after: nil, limit: 20).filter { $0.id != "n_9" }, kept)
        XCTAssertEqual(try store.notification(bob, id: "n_b1"), note("n_b1", "b1", user: bob))
        XCTAssertEqual(try store.pruneChanges(before: t + 1_000, limit: 2), Pruned(changes: 0, more: false))
    }

    /// Pruning changes leaves every notification as it was, however read.
    func assertNotificationsKept(_ kept: [Notification], file: StaticString = #filePath, line: UInt = #line) throws {
        XCTAssertEqual(try store.history(alice, after: nil, limit: 10), kept, file: file, line: line)
        for n in kept {
            XCTAssertEqual(try store.notification(alice, id: n.id), n, file: file, line: line)
            XCTAssertEqual(try store.notification(alice, appNotificationId: n.appNotificationId), n, file: file, line: line)
        }
        XCTAssertEqual(try store.due(.expiry, until: .max, limit: 10).filter { $0.0 == alice }.map(\.1).sorted { $0.id < $1.id },
                       kept.sorted { $0.id < $1.id }, file: file, line: line)
    }

    // MARK: Transactions

    func checkRollbackUndoesWritesAndSeq() throws {
        let kept = try publish(alice, note("n_1", "t1"))
        try store.saveDevice(alice, Device(deviceId: "phone", platform: .ios, lastSeenAt: 1))

        try store.begin()
        let undone = try publish(alice, note("n_2", "t2"))
        XCTAssertEqual(try store.notification(alice, id: "n_2")?.id, "n_2", "visible inside the transaction")
        _ = try store.delete(alice, note("n_1", "t1"), reason: .deleted, at: Self.t0)
        try publish(bob, note("n_3", "t3", user: bob))
        try store.saveDevice(alice, Device(deviceId: "phone", platform: .web, lastSeenAt: 2))
        try store.saveDevice(alice, Device(deviceId: "tab", lastSeenAt: 2))
        store.rollback()

        XCTAssertNil(try store.notification(alice, id: "n_2"))
        XCTAssertEqual(try store.notification(alice, id: "n_1")?.id, "n_1")
        XCTAssertNil(try store.notification(bob, id: "n_3"))
        XCTAssertEqual(try store.feed(alice).head, kept.seq)
        XCTAssertEqual(try store.feed(bob).head, 0)
        XCTAssertEqual(try store.changes(alice, after: 0, limit: 10).map(\.seq), [kept.seq])
        XCTAssertEqual(try store.devices(alice), [Device(deviceId: "phone", platform: .ios, lastSeenAt: 1)])
        XCTAssertEqual(try store.history(alice, after: nil, limit: 10).map(\.id), ["n_1"])

        // The undone seq was never acknowledged; the next write may take it.
        try store.begin()
        let again = try publish(alice, note("n_2", "t2"))
        try store.commit()
        XCTAssertGreaterThan(again.seq, kept.seq)
        XCTAssertLessThanOrEqual(again.seq, undone.seq)
        XCTAssertEqual(try store.notification(alice, id: "n_2")?.id, "n_2")
        XCTAssertEqual(try store.feed(alice).head, again.seq)

        // A commit keeps every write of the batch.
        try store.begin()
        let b1 = try publish(bob, note("n_b1", "b1", user: bob))
        let b2 = try publish(bob, note("n_b2", "b2", user: bob))
        try store.commit()
        XCTAssertEqual(try store.changes(bob, after: 0, limit: 10).map(\.seq), [b1.seq, b2.seq])
        // rollback/commit with nothing open are harmless.
        store.rollback()
        try store.commit()
        XCTAssertEqual(try store.feed(bob).head, b2.seq)
    }

    // MARK: Counts

    /// The targetings the counts checks mix: some differ only in the order
    /// or repeats of their platforms, and must count as one.
    static let countTargetings: [(platforms: [Platform]?, tags: String?)] = [
        (nil, nil), ([.web], nil), ([.ios, .web], nil), ([.web, .ios, .web], nil), ([], nil),
        (nil, "a"), (nil, "a || b"), ([.android], "a"), ([.android, .ios], "!muted"), ([.ios, .android], "!muted"),
    ]

    /// Random publishes, replacements (some retargeting), state updates and
    /// deletes over three users, in batches that commit or roll back: after
    /// every write the counts are what a scan of the history gives.
    func checkCountsFollowEveryWrite() throws {
        var rng = SplitMix64(seed: 0x4865_7261_6C64)
        let users = [alice, bob, aliceInApp2]
        var made = 0
        var inBatch = false
        for step in 0..<600 {
            if !inBatch, Int.random(in: 0..<4, using: &rng) == 0 {
                try store.begin()
                inBatch = true
            }
            let user = users.randomElement(using: &rng)!
            let live = try store.history(user, after: nil, limit: 1000)
            let t = Self.countTargetings.randomElement(using: &rng)!
            switch (Int.random(in: 0..<10, using: &rng), live.randomElement(using: &rng)) {
            case (0..<4, _), (_, nil):
                made += 1
                var n = note("n_\(made)", "a\(made)", user: user, createdAt: Self.t0 + Millis(made), platforms: t.platforms, tags: t.tags)
                n.readState = ReadState.allCases.randomElement(using: &rng)!
                n.seenState = SeenState.allCases.randomElement(using: &rng)!
                n.userActionState = UserActionState.allCases.randomElement(using: &rng)!
                try publish(user, n)
            case (4..<6, let old?):
                var n = note(old.id, old.appNotificationId, user: user, createdAt: old.createdAt, payload: ["step": .int(Int64(step))],
                             platforms: t.platforms, tags: t.tags, version: old.version + 1)
                n.readState = old.readState
                n.seenState = old.seenState
                n.userActionState = old.userActionState
                try publish(user, n)
            case (6..<8, var n?):
                n.readState = ReadState.allCases.randomElement(using: &rng)!
                n.seenState = SeenState.allCases.randomElement(using: &rng)!
                n.userActionState = UserActionState.allCases.randomElement(using: &rng)!
                n.version += 1
                try publish(user, n)
            case (_, let n?):
                let reason = [DeleteReason.deleted, .expired, .hidden].randomElement(using: &rng)!
                _ = try store.delete(user, n, reason: reason, at: Self.t0 + Millis(step))
            }
            try assertCountsMatchHistory(store, user, "after step \(step)")
            if inBatch, Int.random(in: 0..<5, using: &rng) == 0 {
                if Bool.random(using: &rng) { try store.commit() } else { store.rollback() }
                inBatch = false
                for u in users { try assertCountsMatchHistory(store, u, "after the batch that ended at step \(step)") }
            }
        }
        if inBatch { try store.commit() }
        for u in users { try assertCountsMatchHistory(store, u) }
        XCTAssertEqual(try store.counts(UserKey(app: "app1", user: "nobody")), [])
    }

    /// `seenState` apart from `readState`: stored and read back as written,
    /// in the notification, its change's presences and the counts, through
    /// a publish, a state change, a replace, a delete and an expiry.
    func checkSeenStateRoundTripsAndIsCounted() throws {
        func counts() throws -> TargetingCounts? { keyed(try store.counts(alice))["*|*"] }
        var n1 = note("n_1", "a1")
        XCTAssertEqual(n1.seenState, .unseen)
        let r1 = try publish(alice, n1)
        XCTAssertEqual(r1.after?.unseen, true)
        XCTAssertEqual(try counts()?.unseen, 1)
        try publish(alice, note("n_2", "a2", expiresAt: Self.t0 + 1000))
        XCTAssertEqual(try counts(), TargetingCounts(targeting: .everyone, unread: 2, unseen: 2, noInteraction: 2, total: 2))

        // Seen, still unread.
        let was = n1
        n1.seenState = .seen
        n1.version += 1
        let r2 = try publish(alice, n1)
        XCTAssertEqual(try store.notification(alice, id: "n_1")?.seenState, .seen)
        XCTAssertEqual(try store.notification(alice, id: "n_1")?.readState, .unread)
        XCTAssertEqual(r2.before, Presence(was))
        XCTAssertEqual(r2.after?.unseen, false)
        XCTAssertEqual(r2.after?.unread, true)
        XCTAssertEqual(try counts(), TargetingCounts(targeting: .everyone, unread: 2, unseen: 1, noInteraction: 2, total: 2))
        let stored = try store.changes(alice, after: r1.seq, limit: 10).first { $0.seq == r2.seq }
        XCTAssertEqual(stored.map { $0.badgeDelta(for: .unnamed) }, Badge(unread: 0, unseen: -1))
        XCTAssertEqual(stored.flatMap { try? JSONParser.parse($0.encoded).objectValue?["notification"]?.objectValue?["seenState"] },
                       "seen")
        XCTAssertEqual(try store.history(alice, after: nil, limit: 10).first { $0.id == "n_1" }?.seenState, .seen)

        // A replace (the gateway resets it to unseen) moves it back.
        var replaced = note("n_1", "a1", payload: ["title": "again"], version: n1.version + 1)
        replaced.seenState = .unseen
        try publish(alice, replaced)
        XCTAssertEqual(try counts()?.unseen, 2)

        // Deleting a seen one leaves unseen as it was; an unseen one lowers it.
        var seenAgain = replaced
        seenAgain.seenState = .seen
        seenAgain.version += 1
        try publish(alice, seenAgain)
        XCTAssertEqual(try counts()?.unseen, 1)
        _ = try store.delete(alice, seenAgain, reason: .deleted, at: Self.t0 + 1)
        XCTAssertEqual(try counts(), TargetingCounts(targeting: .everyone, unread: 1, unseen: 1, noInteraction: 1, total: 1))
        let expiring = try XCTUnwrap(store.due(.expiry, until: Self.t0 + 1000, limit: 10, in: .whole).first)
        XCTAssertEqual(expiring.1.seenState, .unseen)
        _ = try store.delete(alice, expiring.1, reason: .expired, at: Self.t0 + 1000)
        XCTAssertNil(try counts())
        try assertCountsMatchHistory(store, alice)
    }

    func checkCountsUndoneByRollback() throws {
        try publish(alice, note("n_1", "a1"))
        try publish(alice, note("n_2", "a2", platforms: [.ios]))
        let before = keyed(try store.counts(alice))
        XCTAssertEqual(before.count, 2)

        try store.begin()
        var n1 = try XCTUnwrap(store.notification(alice, id: "n_1"))
        n1.readState = .read
        n1.version += 1
        try publish(alice, n1)
        // Retargeted: one entry goes, another comes.
        try publish(alice, note("n_2", "a2", platforms: [.web], tags: "a", version: 2))
        try publish(alice, note("n_3", "a3", tags: "b"))
        _ = try store.delete(alice, n1, reason: .deleted, at: Self.t0 + 1)
        try publish(bob, note("n_4", "a4", user: bob))
        XCTAssertNotEqual(keyed(try store.counts(alice)), before, "visible inside the transaction")
        XCTAssertEqual(try store.counts(bob).count, 1)
        store.rollback()

        XCTAssertEqual(keyed(try store.counts(alice)), before)
        XCTAssertEqual(try store.counts(bob), [])
        try assertCountsMatchHistory(store, alice)
    }

    // MARK: Readers

    /// What one read of a store returns, comparable as a whole.
    struct Reads: Equatable {
        var epoch: String
        var feed: FeedState
        var notification: Notification?
        var changes: [Change]
        var encoded: [[UInt8]]
        var presence: [[Presence?]]
        var history: [Notification]
        var counts: [String: TargetingCounts]
        var devices: [Device]

        init(_ r: StoreReading, _ user: UserKey) throws(StoreError) {
            epoch = r.epoch
            feed = try r.feed(user)
            notification = try r.notification(user, id: "n_2")
            let records = try r.changes(user, after: 0, limit: 100)
            changes = records.map(\.change)
            encoded = records.map(\.encoded)
            presence = records.map { [$0.before, $0.after] }
            history = try r.history(user, after: nil, limit: 100)
            counts = keyed(try r.counts(user))
            devices = try r.devices(user)
        }
    }

    func checkReaderReadsWhatTheStoreReads() throws {
        // nil: only the owner's thread reads this store.
        guard let reader = try store.makeReader() else { return }
        let n1 = note("n_1", "a1", platforms: [.ios, .web], tags: "a && !b")
        try publish(alice, n1)
        try publish(alice, note("n_2", "a2", createdAt: Self.t0 + 1))
        _ = try store.delete(alice, n1, reason: .hidden, at: Self.t0 + 2)
        try publish(alice, note("n_3", "a3", createdAt: Self.t0 + 3, platforms: [.android]))
        try store.saveDevice(alice, Device(deviceId: "phone", platform: .ios, tags: ["a"], lastSeenAt: 1))

        let expected = try Reads(store, alice)
        XCTAssertEqual(expected.changes.count, 4)
        XCTAssertEqual(try Reads(reader, alice), expected)
        XCTAssertEqual(try reader.read { r throws(StoreError) in try Reads(r, alice) }, expected)
    }

    // MARK: Preferences (SPEC section 12)

    /// Saved per user with a change of their own, which every device
    /// receives; read back by every read path, inside a transaction too
    /// (PostgreSQL: from its feed cache on a later one); undone by a rollback.
    func checkPreferencesSavedPerUserWithAChange() throws {
        XCTAssertEqual(try store.preferences(alice), .unsaved)
        try publish(alice, note("n_1", "a1"))
        let p1 = Preferences(default: Channels(push: false), groups: ["ads": Channels(inbox: false)],
                             critical: ["security"], version: 1, updatedAt: Self.t0 + 5)
        let r1 = try store.savePreferences(alice, p1, at: Self.t0 + 5)
        XCTAssertEqual(r1.seq, 2)
        XCTAssertEqual(r1.change.op, .preferences(p1), "the change carries critical as the save had it")
        XCTAssertEqual(try store.preferences(alice), p1.with(critical: []), "the store keeps no critical")
        XCTAssertEqual(try store.feed(alice).head, 2)
        for other in [bob, aliceInApp2] {
            XCTAssertEqual(try store.preferences(other), .unsaved, "\(other) is untouched")
            XCTAssertEqual(try store.feed(other).head, 0)
        }
        let stored = try store.changes(alice, after: 1, limit: 10)
        XCTAssertEqual(stored.count, 1)
        assertSame(stored[0], r1)
        let tablet = Viewer(userId: "alice", device: Device(deviceId: "tablet", platform: .android, tags: [], lastSeenAt: 0))
        XCTAssertEqual(stored[0].bytes(for: tablet), r1.encoded, "no device is excluded from preferences")
        XCTAssertEqual(stored[0].badgeDelta(for: tablet), .zero)

        try store.begin()
        try store.claim([alice])
        XCTAssertEqual(try store.preferences(alice), p1.with(critical: []))
        let p2 = Preferences(groups: [:], version: 2, updatedAt: Self.t0 + 6)
        let r2 = try store.savePreferences(alice, p2, at: Self.t0 + 6)
        XCTAssertEqual(try store.preferences(alice), p2, "the transaction reads its own save")
        try store.commit()
        XCTAssertEqual(r2.seq, 3)

        try store.begin()
        try store.claim([alice])
        XCTAssertEqual(try store.preferences(alice), p2, "a later transaction reads the last save")
        _ = try store.savePreferences(alice, Preferences(version: 3, updatedAt: Self.t0 + 7), at: Self.t0 + 7)
        store.rollback()
        XCTAssertEqual(try store.preferences(alice), p2, "a rollback undoes the save")
        XCTAssertEqual(try store.feed(alice).head, 3, "and its seq")
        try store.begin()
        try store.claim([alice])
        XCTAssertEqual(try store.preferences(alice), p2)
        try store.commit()

        if let reader = try store.makeReader() {
            XCTAssertEqual(try reader.read { r throws(StoreError) in try r.preferences(alice) }, p2)
            XCTAssertEqual(try reader.preferences(bob), .unsaved)
        }
    }

    /// Heads of many feeds at once (the feed audit's read), also past one
    /// statement's 500 users and through a reader.
    func checkHeadsOfManyFeeds() throws {
        let many = (0..<600).map { UserKey(app: "app3", user: "u:\($0)@x") }
        try store.begin()
        try store.claim(many)
        for (i, u) in many.enumerated() { try publish(u, note("n_m\(i)", "m", user: u)) }
        try store.commit()
        try publish(alice, note("n_1", "a1"))
        try publish(bob, note("n_2", "b1", user: bob))
        try publish(bob, note("n_3", "b2", user: bob))
        var expected = [alice: Int64(1), bob: 2]
        for u in many { expected[u] = 1 }
        let asked = [alice, bob, aliceInApp2] + many
        // A feed with no change yet may be left out, or be 0.
        func known(_ h: [UserKey: Int64]) -> [UserKey: Int64] { h.filter { $0.value > 0 } }
        XCTAssertEqual(known(try store.heads(asked)), expected)
        XCTAssertEqual(try store.heads([]), [:])
        guard let reader = try store.makeReader() else { return }
        XCTAssertEqual(known(try reader.read { r throws(StoreError) in try r.heads(asked) }), expected)
    }

    // MARK: Devices

    /// Registrations of many users at once (a resubscription's read), in
    /// registration order, also past one statement's 500 users and through
    /// a reader; a user with none may be left out.
    func checkDevicesOfManyUsers() throws {
        let many = (0..<600).map { UserKey(app: "app3", user: "u:\($0)@x") }
        var expected: [UserKey: [Device]] = [:], withPush: [UserKey: [Device]] = [:]
        for (i, u) in many.enumerated() {
            // Every third user's second device holds a handle (each its own token).
            let handle = i % 3 == 0 ? PushHandle.apns(token: String(repeating: "0", count: 60) + String(format: "%04x", i), environment: .production) : nil
            let ds = [Device(deviceId: "z\(i)", platform: .ios, tags: ["t\(i)"], lastSeenAt: Int64(i), viewGeneration: 2),
                      Device(deviceId: "a\(i)", lastSeenAt: 7, push: handle)]
            for d in ds { try store.saveDevice(u, d) }
            expected[u] = ds
            if handle != nil { withPush[u] = [ds[1]] }
        }
        try store.saveDevice(aliceInApp2, Device(deviceId: "other-app", lastSeenAt: 1))
        // A holder of another app in the same ask.
        let bobs = Device(deviceId: "b", lastSeenAt: 3, push: .fcm(token: "bob-token"))
        try store.saveDevice(bob, bobs)
        expected[bob] = [bobs]
        withPush[bob] = [bobs]
        let asked = many + [alice, bob]
        func known(_ d: [UserKey: [Device]]) -> [UserKey: [Device]] { d.filter { !$0.value.isEmpty } }
        XCTAssertEqual(known(try store.devices(of: asked)), expected)
        XCTAssertEqual(try store.devices(of: []), [:])
        XCTAssertEqual(try store.pushDevices(of: asked), withPush, "only registrations with a handle, only users with one")
        XCTAssertEqual(try store.pushDevices(of: []), [:])
        guard let reader = try store.makeReader() else { return }
        XCTAssertEqual(known(try reader.read { r throws(StoreError) in try r.devices(of: asked) }), expected)
    }

    func checkDevices() throws {
        XCTAssertEqual(try store.devices(alice), [])
        let phone = Device(deviceId: "phone-1", platform: .ios, tags: ["lang:it", "beta"], lastSeenAt: 100)
        let web = Device(deviceId: "web-1", platform: .web, tags: [], lastSeenAt: 200)
        try store.saveDevice(alice, phone)
        try store.saveDevice(alice, web)
        try store.saveDevice(bob, Device(deviceId: "phone-1", lastSeenAt: 300))
        try store.saveDevice(aliceInApp2, Device(deviceId: "x", lastSeenAt: 300))
        XCTAssertEqual(try store.devices(alice), [phone, web])
        XCTAssertEqual(try store.device(alice, id: "web-1"), web)

        // Replace keeps the registration's place.
        let phone2 = Device(deviceId: "phone-1", platform: .android, tags: ["lang:en"], lastSeenAt: 150, viewGeneration: 3)
        try store.saveDevice(alice, phone2)
        XCTAssertEqual(try store.devices(alice), [phone2, web])
        XCTAssertEqual(try store.devices(bob), [Device(deviceId: "phone-1", lastSeenAt: 300)])

        let listed = try store.usersWithDevices(app: "app1").sorted { $0.user < $1.user }
        XCTAssertEqual(listed.map(\.user), ["alice", "bob"])
        XCTAssertEqual(listed.first?.devices, [phone2, web])
        XCTAssertEqual(try store.usersWithDevices(app: "app2").map(\.user), ["alice"])
        XCTAssertEqual(try store.usersWithDevices(app: "app3").count, 0)

        XCTAssertTrue(try store.deleteDevice(alice, id: "web-1"))
        XCTAssertFalse(try store.deleteDevice(alice, id: "web-1"))
        XCTAssertFalse(try store.deleteDevice(alice, id: "nope"))
        XCTAssertEqual(try store.devices(alice), [phone2])

        // Lapse: last seen strictly before the bound.
        XCTAssertEqual(try store.pruneDevices(lastSeenBefore: 150), 0)
        XCTAssertEqual(try store.pruneDevices(lastSeenBefore: 151), 1)
        XCTAssertEqual(try store.devices(alice), [])
        XCTAssertEqual(try store.usersWithDevices(app: "app1").map(\.user), ["bob"])
        XCTAssertEqual(try store.pruneDevices(lastSeenBefore: 1000), 2)
        XCTAssertEqual(try store.usersWithDevices(app: "app1").count, 0)
    }

    // MARK: Push handles and the outbox

    static let apnsToken = String(repeating: "ab", count: 32)

    func checkPushHandlesAreStoredAndFoundByKey() throws {
        let handle = PushHandle.apns(token: Self.apnsToken, environment: .development)
        let phone = Device(deviceId: "phone-1", platform: .ios, lastSeenAt: 100, push: handle)
        try store.saveDevice(alice, phone)
        try store.saveDevice(bob, Device(deviceId: "tab", lastSeenAt: 100))
        XCTAssertEqual(try store.devices(alice), [phone])
        XCTAssertEqual(try store.devices(of: [alice])[alice], [phone])
        XCTAssertEqual(try store.usersWithDevices(app: "app1").first { $0.user == "alice" }?.devices, [phone])
        XCTAssertTrue(try store.pushHolder(app: "app1", key: handle.key)! == (user: "alice", deviceId: "phone-1"))
        XCTAssertNil(try store.pushHolder(app: "app2", key: handle.key), "a handle's key is per app")
        XCTAssertNil(try store.pushHolder(app: "app1", key: "fcm:x"))

        var cleared = phone
        cleared.push = nil
        try store.saveDevice(alice, cleared)
        XCTAssertEqual(try store.devices(alice), [cleared])
        XCTAssertNil(try store.pushHolder(app: "app1", key: handle.key))
    }

    func tap(_ cursor: Int64, id: String? = "n_1") -> PushMessage {
        PushMessage(kind: .tap, op: .state, cursor: cursor, epoch: "e", notificationId: id, expiresAt: Self.t0 + Self.day)
    }

    func checkPushOutboxClaimsFinishesAndRetries() throws {
        let alert = PushMessage(kind: .alert, op: .upsert, cursor: 1, epoch: "e", notificationId: "n_1", title: "T", body: "B",
                                threadId: "g", high: true, change: ["seq": 1], expiresAt: Self.t0 + Self.day)
        try store.begin()
        try store.enqueuePush(alice, deviceId: "phone", alert, at: Self.t0, claimUntil: nil)
        try store.enqueuePush(bob, deviceId: "tab", tap(5), at: Self.t0 + 1, claimUntil: nil)
        try store.commit()
        XCTAssertEqual(try store.pendingPushes(), 2)

        try store.begin()
        XCTAssertEqual(try store.claimPushes(now: Self.t0 - 1, until: Self.t0 + 1000, limit: 10), [], "nothing is due before it was recorded")
        let claimed = try store.claimPushes(now: Self.t0 + 1, until: Self.t0 + 1000, limit: 10)
        try store.commit()
        XCTAssertEqual(claimed.map(\.message), [alert, tap(5)])
        XCTAssertEqual(claimed.map(\.user), [alice, bob])
        XCTAssertEqual(claimed.first?.committedAt, Self.t0)
        try store.begin()
        XCTAssertEqual(try store.claimPushes(now: Self.t0 + 2, until: Self.t0 + 1000, limit: 10), [], "held until the claim runs out")
        try store.finishPush(claimed[0])
        try store.retryPush(claimed[1], at: Self.t0 + 5000)
        try store.commit()
        XCTAssertEqual(try store.pendingPushes(), 1)

        try store.begin()
        XCTAssertEqual(try store.claimPushes(now: Self.t0 + 4999, until: Self.t0 + 9000, limit: 10), [])
        let again = try store.claimPushes(now: Self.t0 + 5000, until: Self.t0 + 9000, limit: 10)
        try store.commit()
        XCTAssertEqual(again.map(\.attempts), [1])

        // A claim that runs out (its node died) lets the push go to another.
        try store.begin()
        XCTAssertEqual(try store.claimPushes(now: Self.t0 + 9000, until: Self.t0 + 20_000, limit: 10).map(\.id), again.map(\.id))
        try store.commit()
    }

    func checkWebhookOutboxClaimsPerEndpointFinishesRetriesAndDrops() throws {
        let body = Array(#"{"type":"notification.read"}"#.utf8)
        try store.begin()
        try store.enqueueWebhook(app: "a", url: "http://one", eventId: "msg_1", body: body, at: Self.t0)
        try store.enqueueWebhook(app: "a", url: "http://two", eventId: "msg_1", body: body, at: Self.t0)
        try store.enqueueWebhook(app: "a", url: "http://one", eventId: "msg_2", body: body, at: Self.t0 + 1)
        try store.commit()
        XCTAssertEqual(try store.pendingWebhooks(), 3)
        XCTAssertEqual(try store.pendingWebhooks(app: "a", url: "http://one", upTo: 10), 2, "one endpoint's, the inspector's")
        XCTAssertEqual(try store.pendingWebhooks(app: "a", url: "http://one", upTo: 1), 1, "counted up to the limit")
        XCTAssertEqual(try store.pendingWebhooks(app: "b", url: "http://one", upTo: 10), 0)

        // A rolled-back enqueue leaves nothing, count included.
        try store.begin()
        try store.enqueueWebhook(app: "a", url: "http://one", eventId: "msg_3", body: body, at: Self.t0 + 2)
        store.rollback()
        XCTAssertEqual(try store.pendingWebhooks(), 3)

        try store.begin()
        XCTAssertEqual(try store.claimWebhooks(app: "a", url: "http://one", now: Self.t0 - 1, until: Self.t0 + 1000, limit: 10), [])
        let one = try store.claimWebhooks(app: "a", url: "http://one", now: Self.t0 + 1, until: Self.t0 + 1000, limit: 1)
        try store.commit()
        XCTAssertEqual(one.map(\.eventId), ["msg_1"], "oldest first, at most the limit, this endpoint's only")
        XCTAssertEqual(one.first?.body, body)
        XCTAssertEqual(one.first?.committedAt, Self.t0)
        try store.begin()
        let rest = try store.claimWebhooks(app: "a", url: "http://one", now: Self.t0 + 2, until: Self.t0 + 1000, limit: 10)
        XCTAssertEqual(rest.map(\.eventId), ["msg_2"], "held until the claim runs out")
        XCTAssertEqual(try store.claimWebhooks(app: "b", url: "http://one", now: Self.t0 + 2, until: Self.t0 + 1000, limit: 10), [])
        try store.finishWebhook(one[0])
        try store.retryWebhook(rest[0], at: Self.t0 + 5000, attempted: true)
        try store.commit()
        XCTAssertEqual(try store.pendingWebhooks(), 2)

        try store.begin()
        XCTAssertEqual(try store.claimWebhooks(app: "a", url: "http://one", now: Self.t0 + 4999, until: Self.t0 + 9000, limit: 10), [])
        let tried = try store.claimWebhooks(app: "a", url: "http://one", now: Self.t0 + 5000, until: Self.t0 + 9000, limit: 10)
        XCTAssertEqual(tried.map(\.attempts), [1])
        // Given back unsent (it waited past its time-out in the client): due again, no attempt counted.
        try store.retryWebhook(tried[0], at: Self.t0 + 5000, attempted: false)
        let again = try store.claimWebhooks(app: "a", url: "http://one", now: Self.t0 + 5000, until: Self.t0 + 9000, limit: 10)
        try store.commit()
        XCTAssertEqual(again.map(\.attempts), [1])
        // A claim that runs out (its node died) lets the delivery go to another.
        try store.begin()
        XCTAssertEqual(try store.claimWebhooks(app: "a", url: "http://one", now: Self.t0 + 9000, until: Self.t0 + 20_000, limit: 10).map(\.id),
                       again.map(\.id))
        try store.commit()

        try store.begin()
        XCTAssertEqual(try store.dropWebhooks(committedBefore: Self.t0 + 1, limit: 10), 1, "the one of t0 that is left")
        try store.commit()
        XCTAssertEqual(try store.pendingWebhooks(), 1)
        try store.begin()
        XCTAssertEqual(try store.claimWebhooks(app: "a", url: "http://two", now: Self.t0 + 30_000, until: Self.t0 + 40_000, limit: 10), [])
        try store.commit()
    }

    func checkTapsToOneDeviceShareOneRow() throws {
        try store.begin()
        try store.enqueuePush(alice, deviceId: "phone", tap(1), at: Self.t0, claimUntil: nil)
        try store.enqueuePush(alice, deviceId: "phone", tap(2), at: Self.t0 + 1, claimUntil: nil)
        try store.enqueuePush(alice, deviceId: "tablet", tap(2), at: Self.t0 + 1, claimUntil: nil)
        try store.commit()
        XCTAssertEqual(try store.pendingPushes(), 2)
        try store.begin()
        let claimed = try store.claimPushes(now: Self.t0 + 10, until: Self.t0 + 1000, limit: 10)
        XCTAssertEqual(claimed.map(\.message.cursor), [2, 2], "the waiting tap took the later cursor")
        // A tap recorded while the row is in flight: the row is sent again.
        try store.enqueuePush(alice, deviceId: "phone", tap(3), at: Self.t0 + 20, claimUntil: nil)
        for job in claimed { try store.finishPush(job) }
        try store.commit()
        XCTAssertEqual(try store.pendingPushes(), 1)
        try store.begin()
        let resent = try store.claimPushes(now: Self.t0 + 21, until: Self.t0 + 1000, limit: 10)
        try store.commit()
        XCTAssertEqual(resent.map(\.message.cursor), [3])
        XCTAssertEqual(resent.map(\.deviceId), ["phone"])
    }

    func checkPushClaimedAsItIsRecorded() throws {
        try store.begin()
        let held = try store.enqueuePush(alice, deviceId: "phone", tap(1), at: Self.t0, claimUntil: Self.t0 + 1000)
        let joined = try store.enqueuePush(alice, deviceId: "phone", tap(2), at: Self.t0 + 1, claimUntil: Self.t0 + 1000)
        let waiting = try store.enqueuePush(bob, deviceId: "phone", tap(1), at: Self.t0, claimUntil: nil)
        try store.commit()
        XCTAssertEqual(held?.message, tap(1))
        XCTAssertEqual(held?.generation, 0)
        XCTAssertEqual(held?.committedAt, Self.t0)
        XCTAssertNil(joined, "a tap that joined the row in flight is not claimed again")
        XCTAssertNil(waiting, "nothing is claimed without claimUntil")
        try store.begin()
        XCTAssertEqual(try store.claimPushes(now: Self.t0 + 10, until: Self.t0 + 1000, limit: 10).map(\.user), [bob],
                       "the claimed row is held")
        // The row in flight was replaced: finished, it is due again with the later tap.
        try store.finishPush(held!)
        try store.commit()
        try store.begin()
        let again = try store.claimPushes(now: Self.t0 + 11, until: Self.t0 + 2000, limit: 10)
        try store.commit()
        XCTAssertEqual(again.map(\.message), [tap(2)])
        XCTAssertEqual(again.map(\.id), [held!.id])
        // A claim taken with the change lapses like any other.
        try store.begin()
        let lapsing = try store.enqueuePush(bob, deviceId: "tab", tap(3), at: Self.t0 + 20, claimUntil: Self.t0 + 3000)
        XCTAssertNotNil(lapsing)
        XCTAssertEqual(try store.claimPushes(now: Self.t0 + 3000, until: Self.t0 + 9000, limit: 10).map(\.deviceId), ["phone", "phone", "tab"])
        store.rollback()
        XCTAssertEqual(try store.pendingPushes(), 2, "a rolled-back claimed push was never recorded")
    }

    func checkTapsWaitOutTheirSpacing() throws {
        let alert = PushMessage(kind: .alert, op: .upsert, cursor: 2, epoch: "e", notificationId: "n_2", title: "T", body: "B",
                                threadId: nil, high: false, change: nil, expiresAt: Self.t0 + Self.day)
        try store.begin()
        let sent = try store.enqueuePush(alice, deviceId: "phone", tap(1), at: Self.t0, claimUntil: Self.t0 + 1000)
        try store.finishPush(sent!)
        try store.spaceTaps(alice, deviceId: "phone", until: Self.t0 + 15_000)
        try store.commit()
        try store.begin()
        let held = try store.enqueuePush(alice, deviceId: "phone", tap(2), at: Self.t0 + 5_000, claimUntil: Self.t0 + 6_000)
        let alerted = try store.enqueuePush(alice, deviceId: "phone", alert, at: Self.t0 + 5_000, claimUntil: Self.t0 + Self.day)
        let other = try store.enqueuePush(alice, deviceId: "tablet", tap(2), at: Self.t0 + 5_000, claimUntil: Self.t0 + Self.day)
        try store.commit()
        XCTAssertNil(held, "a tap within the spacing is not claimed as it is recorded")
        XCTAssertNotNil(alerted, "an alert is not spaced")
        XCTAssertNotNil(other, "another device's taps are not spaced")
        try store.begin()
        XCTAssertEqual(try store.claimPushes(now: Self.t0 + 14_999, until: Self.t0 + 20_000, limit: 10), [])
        let due = try store.claimPushes(now: Self.t0 + 15_000, until: Self.t0 + 20_000, limit: 10)
        XCTAssertEqual(due.map(\.message.cursor), [2], "due when the spacing ends")
        // A tap recorded while that one is in flight: after it, spaced again.
        try store.enqueuePush(alice, deviceId: "phone", tap(3), at: Self.t0 + 15_500, claimUntil: nil)
        try store.finishPush(due[0])
        try store.spaceTaps(alice, deviceId: "phone", until: Self.t0 + 31_000)
        try store.commit()
        try store.begin()
        XCTAssertEqual(try store.claimPushes(now: Self.t0 + 30_999, until: Self.t0 + 40_000, limit: 10), [])
        XCTAssertEqual(try store.claimPushes(now: Self.t0 + 31_000, until: Self.t0 + 40_000, limit: 10).map(\.message.cursor), [3])
        try store.commit()
        try store.begin()
        try store.spaceTaps(bob, deviceId: "tab", until: Self.t0 + 60_000)
        store.rollback()
        try store.begin()
        try store.spaceTaps(bob, deviceId: "phone", until: Self.t0 + 60_000)
        _ = try store.pruneDevices(lastSeenBefore: Self.t0 + 60_001)
        try store.commit()
        try store.begin()
        XCTAssertNotNil(try store.enqueuePush(bob, deviceId: "tab", tap(1), at: Self.t0 + 3_000, claimUntil: Self.t0 + 4_000),
                        "a rolled-back spacing holds no tap")
        XCTAssertNotNil(try store.enqueuePush(bob, deviceId: "phone", tap(1), at: Self.t0 + 3_000, claimUntil: Self.t0 + 4_000),
                        "nor one pruned")
        try store.commit()
    }

    func checkSharedTokensAreReplacedOnlyInPlaceOfTheOneRead() throws {
        let name = "apns:TEAM:KEY"
        let a = SharedToken(value: "a", issuedAt: Self.t0), b = SharedToken(value: "b", issuedAt: Self.t0 + 1)
        let c = SharedToken(value: "c", issuedAt: Self.t0 + 2)
        XCTAssertNil(try store.sharedToken(name))
        try store.begin()
        XCTAssertTrue(try store.replaceSharedToken(name, with: a, replacing: nil))
        XCTAssertFalse(try store.replaceSharedToken(name, with: b, replacing: nil), "another process made one first")
        try store.commit()
        XCTAssertEqual(try store.sharedToken(name), a)
        try store.begin()
        XCTAssertFalse(try store.replaceSharedToken(name, with: c, replacing: Self.t0 - 5), "renewed since that was read")
        XCTAssertTrue(try store.replaceSharedToken(name, with: b, replacing: Self.t0))
        XCTAssertTrue(try store.replaceSharedToken("apns:TEAM:KEY2", with: c, replacing: nil), "each name has its own")
        store.rollback()
        XCTAssertEqual(try store.sharedToken(name), a, "a rolled-back renewal never happened")
        XCTAssertNil(try store.sharedToken("apns:TEAM:KEY2"))
        try store.begin()
        XCTAssertTrue(try store.replaceSharedToken(name, with: b, replacing: Self.t0))
        try store.commit()
        XCTAssertEqual(try store.sharedToken(name), b)
    }

    /// The outbox's length is kept, not counted: statements that add or
    /// remove many rows at once, a tap replaced in flight (its row stays)
    /// and a rollback each leave it equal to the pushes there are.
    func checkPendingPushesFollowEveryWrite() throws {
        try store.begin()
        for d in 0..<20 { try store.enqueuePush(alice, deviceId: "d\(d % 4)", tap(1), at: Self.t0, claimUntil: nil) }
        for k in 0..<6 {
            try store.enqueuePush(bob, deviceId: "phone", PushMessage(kind: .alert, op: .upsert, cursor: Int64(k), epoch: "e",
                                                                      notificationId: "n_\(k)", expiresAt: Self.t0 + Self.day),
                                  at: Self.t0, claimUntil: nil)
        }
        try store.commit()
        XCTAssertEqual(try store.pendingPushes(), 10, "four taps (one per device) and six alerts")
        XCTAssertEqual(try store.pendingPushes(alice), ["d0": 1, "d1": 1, "d2": 1, "d3": 1], "by device, the inspector's")
        XCTAssertEqual(try store.pendingPushes(bob), ["phone": 6])
        try store.begin()
        let claimed = try store.claimPushes(now: Self.t0, until: Self.t0 + 1000, limit: 100)
        XCTAssertEqual(claimed.count, 10)
        try store.enqueuePush(alice, deviceId: "d0", tap(2), at: Self.t0 + 1, claimUntil: nil)
        for job in claimed { try store.finishPush(job) }
        XCTAssertEqual(try store.pendingPushes(), 1, "d0's tap, replaced in flight, stays")
        store.rollback()
        XCTAssertEqual(try store.pendingPushes(), 10, "a rollback undoes the count with the rows")
        try store.begin()
        try store.dropPushes(bob, deviceId: "phone")
        try store.finishPush(claimed[0])
        try store.commit()
        XCTAssertEqual(try store.pendingPushes(), 3)
        XCTAssertEqual(try store.pendingPushes(bob), [:])
        try store.begin()
        for d in 1..<4 { try store.dropPushes(alice, deviceId: "d\(d)") }
        try store.commit()
        XCTAssertEqual(try store.pendingPushes(), 0)
    }

    func checkDroppedAndRolledBackPushesLeaveNothing() throws {
        try store.saveDevice(alice, Device(deviceId: "phone", lastSeenAt: 1))
        try store.begin()
        try store.enqueuePush(alice, deviceId: "phone", tap(1), at: Self.t0, claimUntil: nil)
        try store.enqueuePush(bob, deviceId: "phone", tap(1), at: Self.t0, claimUntil: nil)
        try store.commit()
        try store.begin()
        try store.enqueuePush(alice, deviceId: "other", tap(2), at: Self.t0, claimUntil: nil)
        store.rollback()
        XCTAssertEqual(try store.pendingPushes(), 2, "a rolled-back push was never recorded")
        try store.begin()
        XCTAssertTrue(try store.deleteDevice(alice, id: "phone"))
        try store.commit()
        XCTAssertEqual(try store.pendingPushes(), 1, "a deleted device's pushes go with it")
        try store.begin()
        try store.dropPushes(bob, deviceId: "phone")
        try store.commit()
        XCTAssertEqual(try store.pendingPushes(), 0)
    }
}

final class MemoryStoreConformanceTests: StoreConformanceTests {
    override func makeStore() throws -> NotificationStore? { MemoryStore() }

    func testSeqStrictlyIncreasingPerUserAndIndependent() throws { try checkSeqStrictlyIncreasingPerUserAndIndependent() }
    func testUpsertNewAndReplace() throws { try checkUpsertNewAndReplace() }
    func testLookupMisses() throws { try checkLookupMisses() }
    func testDeleteKeepsTombstone() throws { try checkDeleteKeepsTombstone() }
    func testChangesOrderAndBounds() throws { try checkChangesOrderAndBounds() }
    func testHistoryOrderWithTiesAndPaging() throws { try checkHistoryOrderWithTiesAndPaging() }
    func testHistoryPagingAfterDeletedKey() throws { try checkHistoryPagingAfterDeletedKey() }
    func testExpiring() throws { try checkExpiring() }
    func testWaking() throws { try checkWaking() }
    func testPruneChangesRaisesFloor() throws { try checkPruneChangesRaisesFloor() }
    func testPruneChangesInLimitedCalls() throws { try checkPruneChangesInLimitedCalls() }
    func testRollbackUndoesWritesAndSeq() throws { try checkRollbackUndoesWritesAndSeq() }
    func testCountsFollowEveryWrite() throws { try checkCountsFollowEveryWrite() }
    func testCountsUndoneByRollback() throws { try checkCountsUndoneByRollback() }
    func testSeenStateRoundTripsAndIsCounted() throws { try checkSeenStateRoundTripsAndIsCounted() }
    func testReaderReadsWhatTheStoreReads() throws { try checkReaderReadsWhatTheStoreReads() }
    func testDevices() throws { try checkDevices() }
    func testPushHandlesAreStoredAndFoundByKey() throws { try checkPushHandlesAreStoredAndFoundByKey() }
    func testPushOutboxClaimsFinishesAndRetries() throws { try checkPushOutboxClaimsFinishesAndRetries() }
    func testTapsToOneDeviceShareOneRow() throws { try checkTapsToOneDeviceShareOneRow() }
    func testWebhookOutbox() throws { try checkWebhookOutboxClaimsPerEndpointFinishesRetriesAndDrops() }
    func testPushClaimedAsItIsRecorded() throws { try checkPushClaimedAsItIsRecorded() }
    func testDroppedAndRolledBackPushesLeaveNothing() throws { try checkDroppedAndRolledBackPushesLeaveNothing() }
    func testPendingPushesFollowEveryWrite() throws { try checkPendingPushesFollowEveryWrite() }
    func testTapsWaitOutTheirSpacing() throws { try checkTapsWaitOutTheirSpacing() }
    func testSharedTokensAreReplacedOnlyInPlaceOfTheOneRead() throws { try checkSharedTokensAreReplacedOnlyInPlaceOfTheOneRead() }
    func testHeadsOfManyFeeds() throws { try checkHeadsOfManyFeeds() }
    func testDevicesOfManyUsers() throws { try checkDevicesOfManyUsers() }
    func testPreferencesSavedPerUserWithAChange() throws { try checkPreferencesSavedPerUserWithAChange() }
}

final class SQLiteStoreConformanceTests: StoreConformanceTests {
    var dir: URL!

    override func makeStore() throws -> NotificationStore? {
        dir = FileManager.default.temporaryDirectory.appendingPathComponent("herald-store-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        return try SQLiteStore(path: dir.appendingPathComponent("herald.db").path, durability: .off)
    }

    func testSeqStrictlyIncreasingPerUserAndIndependent() throws { try checkSeqStrictlyIncreasingPerUserAndIndependent() }
    func testUpsertNewAndReplace() throws { try checkUpsertNewAndReplace() }
    func testLookupMisses() throws { try checkLookupMisses() }
    func testDeleteKeepsTombstone() throws { try checkDeleteKeepsTombstone() }
    func testChangesOrderAndBounds() throws { try checkChangesOrderAndBounds() }
    func testHistoryOrderWithTiesAndPaging() throws { try checkHistoryOrderWithTiesAndPaging() }
    func testHistoryPagingAfterDeletedKey() throws { try checkHistoryPagingAfterDeletedKey() }
    func testExpiring() throws { try checkExpiring() }
    func testWaking() throws { try checkWaking() }
    func testPruneChangesRaisesFloor() throws { try checkPruneChangesRaisesFloor() }
    func testPruneChangesInLimitedCalls() throws { try checkPruneChangesInLimitedCalls() }
    func testRollbackUndoesWritesAndSeq() throws { try checkRollbackUndoesWritesAndSeq() }
    func testCountsFollowEveryWrite() throws { try checkCountsFollowEveryWrite() }
    func testCountsUndoneByRollback() throws { try checkCountsUndoneByRollback() }
    func testSeenStateRoundTripsAndIsCounted() throws { try checkSeenStateRoundTripsAndIsCounted() }
    func testReaderReadsWhatTheStoreReads() throws { try checkReaderReadsWhatTheStoreReads() }
    func testDevices() throws { try checkDevices() }
    func testPushHandlesAreStoredAndFoundByKey() throws { try checkPushHandlesAreStoredAndFoundByKey() }
    func testPushOutboxClaimsFinishesAndRetries() throws { try checkPushOutboxClaimsFinishesAndRetries() }
    func testTapsToOneDeviceShareOneRow() throws { try checkTapsToOneDeviceShareOneRow() }
    func testWebhookOutbox() throws { try checkWebhookOutboxClaimsPerEndpointFinishesRetriesAndDrops() }
    func testPushClaimedAsItIsRecorded() throws { try checkPushClaimedAsItIsRecorded() }
    func testDroppedAndRolledBackPushesLeaveNothing() throws { try checkDroppedAndRolledBackPushesLeaveNothing() }
    func testPendingPushesFollowEveryWrite() throws { try checkPendingPushesFollowEveryWrite() }
    func testTapsWaitOutTheirSpacing() throws { try checkTapsWaitOutTheirSpacing() }
    func testSharedTokensAreReplacedOnlyInPlaceOfTheOneRead() throws { try checkSharedTokensAreReplacedOnlyInPlaceOfTheOneRead() }
    func testHeadsOfManyFeeds() throws { try checkHeadsOfManyFeeds() }
    func testDevicesOfManyUsers() throws { try checkDevicesOfManyUsers() }
    func testPreferencesSavedPerUserWithAChange() throws { try checkPreferencesSavedPerUserWithAChange() }

    override func tearDown() {
        super.tearDown()
        if let dir { try? FileManager.default.removeItem(at: dir) }
    }
}
