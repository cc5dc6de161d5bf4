import XCTest
import HeraldCore
import HeraldStores
@testable import HeraldGateway

/// A gateway whose users are shared out over two partitions, each an
/// engine with a memory store of its own: every user's writes, reads,
/// follows and deliveries stay in its partition, and what spans users
/// (app-wide sends, a push handle moving between users, expiry) still works.
final class PartitionTests: XCTestCase {
    let me = "/v1/me"
    let app = Harness.app.id

    /// The first `n` user ids (u0, u1, …) that belong to partition `p` of 2.
    func users(in p: Int, _ n: Int) -> [String] {
        Array((0..<1000).lazy.map { "u\($0)" }.filter { Partition.index(of: UserKey(app: Harness.app.id, user: $0), among: 2) == p }.prefix(n))
    }

    func key(_ user: String) -> UserKey { UserKey(app: app, user: user) }

    func head(_ h: Harness, partition p: Int, _ user: String) throws -> Int64 {
        try h.gateway.partitions[p].reads.feed(key(user)).head
    }

    /// Registers one APNs handle for `a`'s phone, then for `b`'s phone2:
    /// the handle moves to `b`.
    func moveHandle(_ h: Harness, from a: String, to b: String, line: UInt = #line) {
        let handle: JSON = ["service": "apns", "token": .string(PushOutboxTests.apnsToken)]
        for (u, d) in [(a, "phone"), (b, "phone2")] {
            let r = h.request("PUT", me + "/devices/\(d)", token: h.token(u, app: PushOutboxTests.app),
                              body: ["platform": "ios", "push": handle])
            h.settle()
            XCTAssertEqual(r.response?.status, 200, line: line)
        }
    }

    /// Each of `users` followed on a WebSocket, with a notification that
    /// expires: every follower gets its own user's expiry, once.
    func expireOneEach(_ h: Harness, _ users: [String], line: UInt = #line) {
        let sockets = users.map { u in
            let s = h.webSocket()
            h.hello(s, user: u)
            h.request("POST", "/v1/apps/\(app)/users/\(u)/notifications", body: ["appNotificationId": "x", "payload": [:], "ttlSeconds": 1])
            return s
        }
        h.settle()
        h.clock.advance(seconds: 2)
        for e in h.gateway.partitions { e.runMaintenance() }
        h.settle()
        for s in sockets {
            s.read()
            let deletes = s.frames.compactMap { f -> JSONObject? in f["type"] == "change" ? f["change"]?.objectValue : nil }
                .filter { $0["op"] == "delete" }
            XCTAssertEqual(deletes.map { $0["reason"] }, ["expired"], line: line)
        }
    }

    func testUsersAreSharedOutOverThePartitions() {
        let n = 10_000
        let counts = (0..<n).reduce(into: [0, 0, 0]) { c, i in c[Partition.index(of: UserKey(app: app, user: "user-\(i)"), among: 3)] += 1 }
        for c in counts { XCTAssertEqual(Double(c), Double(n) / 3, accuracy: Double(n) / 30, "\(counts)") }
        XCTAssertEqual(Partition.index(of: key("anyone"), among: 1), 0)
    }

    func testEachPartitionWritesAndDeliversItsOwnUsersInOrder() throws {
        let h = Harness(partitions: 2)
        let a = users(in: 0, 1)[0], b = users(in: 1, 1)[0]
        let sa = h.webSocket(), sb = h.webSocket()
        h.hello(sa, user: a, cursor: 0)
        h.hello(sb, user: b, cursor: 0)
        h.settle()
        for i in 0..<5 {
            h.publish(a, "n\(i)")
            h.publish(b, "n\(i)")
        }
        h.settle()
        sa.read()
        sb.read()
        XCTAssertEqual(sa.types.first, "welcome")
        XCTAssertEqual(changeSeqs(sa.frames), [1, 2, 3, 4, 5])
        XCTAssertEqual(changeSeqs(sb.frames), [1, 2, 3, 4, 5])
        // Each feed is in its own partition's store, and only there.
        XCTAssertEqual(try head(h, partition: 0, a), 5)
        XCTAssertEqual(try head(h, partition: 1, a), 0)
        XCTAssertEqual(try head(h, partition: 1, b), 5)
        XCTAssertEqual(try head(h, partition: 0, b), 0)
        // Reads go to the user's partition too.
        let history = h.request("GET", me + "/notifications", token: h.token(b))
        let listing = h.request("GET", "/v1/apps/\(app)/users/\(b)/devices")
        h.settle()
        XCTAssertEqual(history.json?["notifications"]?.arrayValue?.count, 5)
        XCTAssertEqual(listing.json?["devices"]?.arrayValue?.first?.objectValue?["transport"], "websocket")
    }

    func testADismissReachesTheUsersOtherDevicesThroughItsPartition() {
        let h = Harness(partitions: 2)
        let b = users(in: 1, 1)[0]
        let phone = h.webSocket(), laptop = h.webSocket()
        h.hello(phone, user: b, device: "phone", cursor: 0)
        h.hello(laptop, user: b, device: "laptop", cursor: 0)
        h.settle()
        let id = h.publish(b, "n1")
        h.settle()
        let nid = id.json!["notification"]!.objectValue!["id"]!
        phone.session.receive(.text(JSON.object(["type": "update", "ref": "r1", "id": nid, "userActionState": "dismissed"]).encoded))
        h.settle()
        phone.read()
        laptop.read()
        XCTAssertEqual(changeSeqs(laptop.frames), [1, 2])
        XCTAssertTrue(phone.frames.contains { $0["type"] == "ack" && $0["ref"] == "r1" })
    }

    func testAnAppWideSendToNamedUsersReachesEveryPartition() throws {
        let h = Harness(partitions: 2)
        let named = users(in: 0, 3) + users(in: 1, 3)
        let send = h.request("POST", "/v1/apps/\(app)/notifications",
                             body: ["userIds": .array(named.map(JSON.string)), "appNotificationId": "all", "payload": [:]])
        h.settle()
        XCTAssertEqual(send.response?.status, 202)
        XCTAssertEqual(send.json?.int("users"), 6)
        for (p, group) in [users(in: 0, 3), users(in: 1, 3)].enumerated() {
            for u in group { XCTAssertEqual(try head(h, partition: p, u), 1, u) }
        }
    }

    func testAnAppWideSendByTagsFindsTheMatchingUsersOfEveryPartition() {
        let h = Harness(partitions: 2)
        let vip = [users(in: 0, 1)[0], users(in: 1, 1)[0]], plain = users(in: 1, 2)[1]
        for u in vip { h.request("PUT", me + "/devices/d", token: h.token(u), body: ["tags": ["vip"]]) }
        h.request("PUT", me + "/devices/d", token: h.token(plain), body: ["tags": ["other"]])
        h.settle()
        let send = h.request("POST", "/v1/apps/\(app)/notifications", body: ["tagExpression": "vip", "appNotificationId": "t", "payload": [:]])
        h.settle()
        XCTAssertEqual(send.response?.status, 202)
        XCTAssertEqual(send.json?.int("users"), 2)
        for u in vip + [plain] {
            let history = h.request("GET", me + "/notifications", token: h.token(u))
            h.settle()
            XCTAssertEqual(history.json?["notifications"]?.arrayValue?.count, u == plain ? 0 : 1, u)
        }
    }

    func testAnAppWideSendThatFailsAnswersTheErrorOnceEveryPartitionAnswered() {
        let failing = FailingStore()
        let h = Harness(store: failing, partitions: 2)
        failing.failCommits = 1
        let named = users(in: 0, 1) + users(in: 1, 1)
        let send = h.request("POST", "/v1/apps/\(app)/notifications",
                             body: ["userIds": .array(named.map(JSON.string)), "appNotificationId": "all", "payload": [:]])
        h.gateway.partitions[0].runQueued()
        h.loop.drain()
        XCTAssertNil(send.response, "partition 0 failed; partition 1 has not answered yet")
        h.settle()
        XCTAssertEqual(send.response?.status, 503)
    }

    func testAPushHandleMovesToAUserOfAnotherPartition() {
        let transport = HeldPushes()
        let h = Harness(partitions: 2, apps: [PushOutboxTests.app], push: transport)
        let a = users(in: 0, 1)[0], b = users(in: 1, 1)[0]
        moveHandle(h, from: a, to: b)
        // The release runs in partition 0's next batch, after b's commit.
        h.settle()
        let listing = h.request("GET", "/v1/apps/\(app)/users/\(a)/devices")
        h.settle()
        XCTAssertEqual(listing.json?["devices"]?.arrayValue?.first?.objectValue?["push"], .null)
        h.publish(a, "n1")
        h.publish(b, "n1")
        h.settle()
        for e in h.gateway.partitions { e.runMaintenance() }
        h.settle()
        XCTAssertEqual(transport.sent.map(\.job.user.user), [b])
    }

    func testEachPartitionExpiresItsOwnUsersNotifications() {
        let h = Harness(partitions: 2)
        let a = users(in: 0, 1)[0], b = users(in: 1, 1)[0]
        expireOneEach(h, [a, b])
    }

    /// Two partitions over one store they share, as PostgreSQL's sessions
    /// share a database (`isShared`): a handle moves to the other
    /// partition's user within the registering batch, the pushes waiting
    /// are counted once, pruning is run by partition 0 alone, and each
    /// partition sweeps only its own users' expired notifications.
    func testPartitionsSharingOneStoreCountPruneAndSweepOnce() {
        let shared = MemoryStore()
        let stores = [FailingStore(over: shared, shared: true), FailingStore(over: shared, shared: true)]
        let transport = HeldPushes()
        let h = Harness(stores: stores, apps: [PushOutboxTests.app], push: transport)
        let a = users(in: 0, 1)[0], b = users(in: 1, 1)[0]
        moveHandle(h, from: a, to: b)
        XCTAssertNil(try shared.device(key(a), id: "phone")?.push, "taken in b's batch, from the store they share")

        // b is not connected: its push waits in flight, counted once.
        h.publish(b, "n1")
        h.settle()
        for e in h.gateway.partitions { e.runMaintenance() }
        h.settle()
        XCTAssertEqual(transport.waiting.count, 1)
        XCTAssertEqual(h.gateway.metrics.push.pending.load(ordering: .relaxed), 1)
        XCTAssertGreaterThan(stores[0].pruneCalls.load(ordering: .relaxed), 0)
        XCTAssertEqual(stores[1].pruneCalls.load(ordering: .relaxed), 0, "store-wide pruning runs once")

        // Each partition sweeps its own: a's expiry reaches a's follower on partition 0 only.
        expireOneEach(h, [a, b])
    }
}
