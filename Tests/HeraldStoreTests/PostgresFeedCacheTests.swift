import XCTest
import HeraldCore
@testable import HeraldStores

/// What the PostgreSQL store's cache of feeds may answer: only what one
/// state of a feed (one head) holds.
final class PostgresFeedCacheTests: XCTestCase {
    let alice = UserKey(app: "app1", user: "alice")
    let t0: Millis = 1_800_000_000_000

    func upsert(_ seq: Int64, _ id: String, user: UserKey? = nil, bytes: Int = 0) -> ChangeRecord {
        let n = Notification(id: id, appNotificationId: "a-" + id, userId: (user ?? alice).user,
                             payload: ["pad": .string(String(repeating: "x", count: bytes))],
                             createdAt: t0, updatedAt: t0, expiresAt: t0 + 1)
        return ChangeRecord(change: Change(seq: seq, op: .upsert(n)), before: nil, after: Presence(n), at: t0)
    }

    func expired(_ seq: Int64, _ id: String) -> ChangeRecord {
        ChangeRecord(change: Change(seq: seq, op: .delete(id: id, appNotificationId: "a-" + id, reason: .expired)),
                     before: nil, after: nil, at: t0)
    }

    func served(_ cache: inout PostgresFeedCache, _ ids: [String], user: UserKey? = nil) -> Int64? {
        let u = user ?? alice
        return cache.serve([u], ids.map { .id(u, $0) }, lockedAt: [:])?.heads[u]
    }

    func testOnlyWhatIsKnownAtTheHeadIsServed() {
        var cache = PostgresFeedCache(budget: 1 << 20)
        XCTAssertNil(served(&cache, []), "an unknown user")
        cache.committed(alice, from: 4, [upsert(5, "n_1"), upsert(6, "n_2")])
        XCTAssertEqual(served(&cache, ["n_1", "n_2"]), 6)
        XCTAssertNil(served(&cache, ["n_3"]), "never seen")
        cache.heard(alice, [upsert(6, "n_9")])
        XCTAssertNil(served(&cache, ["n_9"]), "older than the head: ignored")
        cache.heard(alice, [upsert(7, "n_3")])
        XCTAssertEqual(served(&cache, ["n_1", "n_3"]), 7, "the next change: taken in")
        cache.heard(alice, [upsert(9, "n_4")])
        XCTAssertEqual(served(&cache, ["n_4"]), 9)
        XCTAssertNil(served(&cache, ["n_1"]), "after a gap only what came is known")
        cache.committed(alice, from: 12, [upsert(13, "n_5")])
        XCTAssertNil(served(&cache, ["n_4"]), "a commit from another head starts afresh")
        XCTAssertEqual(served(&cache, ["n_5"]), 13)
        let carol = UserKey(app: "app1", user: "carol")
        cache.committed(carol, from: 0, [])
        XCTAssertNil(cache.serve([alice], [.id(carol, "n_1")], lockedAt: [carol: 1]), "locked at another head")
        XCTAssertNil(cache.serve([alice], [.id(carol, "n_1")], lockedAt: [carol: 0]), "not known")
        cache.forget([alice])
        XCTAssertNil(served(&cache, []))
    }

    func testTheUsersUsedLeastRecentlyGoPastTheBudget() {
        var cache = PostgresFeedCache(budget: 150_000)
        let users = (0..<4).map { UserKey(app: "app1", user: "u\($0)") }
        for u in users.prefix(3) { cache.committed(u, from: 0, [upsert(1, "n_1", user: u, bytes: 20_000)]) }
        XCTAssertEqual(cache.count, 3)
        XCTAssertNotNil(served(&cache, ["n_1"], user: users[0]))
        cache.committed(users[3], from: 0, [upsert(1, "n_1", user: users[3], bytes: 20_000)])
        XCTAssertNotNil(cache.head(users[0]), "used last")
        XCTAssertNil(cache.head(users[1]), "used least recently")
        XCTAssertNil(cache.head(users[2]), "down to three quarters of the budget")
        XCTAssertNotNil(cache.head(users[3]))
    }

    /// A deleted notification is forgotten, not kept as "none": kept, it
    /// weighed nothing against the budget, and a node whose notifications
    /// all expire in time grew without bound.
    func testDeletedNotificationsLeaveNothingBehind() {
        var cache = PostgresFeedCache(budget: 1 << 20)
        cache.committed(alice, from: 0, [upsert(1, "n_0")])
        cache.heard(alice, [expired(2, "n_0")])
        XCTAssertEqual(served(&cache, []), 2)
        XCTAssertNil(served(&cache, ["n_0"]), "not known: the batch reads it")
        for i in 1...1_000 {
            let seq = Int64(2 * i)
            cache.committed(alice, from: seq, [upsert(seq + 1, "n_\(i)"), expired(seq + 2, "n_\(i)")])
        }
        XCTAssertEqual(served(&cache, []), 2_002)
        XCTAssertEqual(cache.lookups, 0, "a thousand notifications come and gone")
    }
}
