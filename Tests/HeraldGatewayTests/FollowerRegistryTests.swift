import XCTest
import HeraldCore
@testable import HeraldGateway

/// The engine's record of followers and connected devices, kept in flat maps.
final class FollowerRegistryTests: XCTestCase {
    let alice = UserKey(app: "a", user: "alice"), bob = UserKey(app: "a", user: "bob")

    /// A registry whose engine thread is the test's.
    func registry(bus: Bool) -> FollowerRegistry {
        let engine = ThreadOwner("engine 0")
        engine.claim()
        return FollowerRegistry(bus: bus, thread: engine)
    }

    func testFollowersPerShardAcrossSixtyFourShards() {
        let r = registry(bus: true)
        for shard in [63, 0, 3, 3] { r.follow(alice, shard: shard) }
        r.follow(bob, shard: 1)
        XCTAssertEqual(Array(r.shards(following: alice)), [0, 3, 63])
        XCTAssertEqual(r.followers(of: alice), 4)
        r.unfollow(alice, shard: 3)
        XCTAssertEqual(Array(r.shards(following: alice)), [0, 3, 63], "shard 3 still has one follower")
        r.unfollow(alice, shard: 3)
        r.unfollow(alice, shard: 3)  // none left there: ignored
        XCTAssertEqual(Array(r.shards(following: alice)), [0, 63])
        r.unfollow(alice, shard: 0)
        r.unfollow(alice, shard: 63)
        XCTAssertTrue(r.shards(following: alice).isEmpty)
        XCTAssertEqual(r.followers(of: alice), 0)
        XCTAssertEqual(Array(r.shards(following: bob)), [1], "another user's follows are apart")
    }

    /// What the bus's thread reads to skip other users' records: the users
    /// with a follower on any shard, no more and no less.
    func testTheBusSeesTheFollowedUsers() {
        let r = registry(bus: true)
        func seen() -> Set<UserKey> { r.followedForBus!.withLock { $0 } }
        r.follow(alice, shard: 0)
        r.follow(alice, shard: 4)
        r.follow(bob, shard: 0)
        XCTAssertEqual(seen(), [alice, bob])
        r.unfollow(alice, shard: 0)
        XCTAssertEqual(seen(), [alice, bob], "alice still followed on shard 4")
        r.unfollow(alice, shard: 4)
        r.unfollow(alice, shard: 4)
        XCTAssertEqual(seen(), [bob])
        XCTAssertEqual(Set(r.followedUsers), seen())
        XCTAssertNil(registry(bus: false).followedForBus, "a single node keeps no such set")
    }

    /// Per-shard counts exist only while a user is followed on several
    /// shards: going from one shard to two and back must keep each count.
    func testCountsSurviveMovesBetweenOneShardAndSeveral() {
        let r = registry(bus: true)
        r.follow(alice, shard: 2)
        r.follow(alice, shard: 2)
        r.follow(alice, shard: 5)
        r.unfollow(alice, shard: 5)
        XCTAssertEqual(Array(r.shards(following: alice)), [2])
        r.follow(alice, shard: 7)
        r.unfollow(alice, shard: 2)
        XCTAssertEqual(Array(r.shards(following: alice)), [2, 7], "shard 2 had two followers")
        r.unfollow(alice, shard: 2)
        XCTAssertEqual(Array(r.shards(following: alice)), [7])
        r.follow(alice, shard: 2)
        r.unfollow(alice, shard: 7)
        XCTAssertEqual(Array(r.shards(following: alice)), [2])
        XCTAssertEqual(r.followers(of: alice), 1)
        r.unfollow(alice, shard: 2)
        XCTAssertEqual(r.followers(of: alice), 0)
        XCTAssertTrue(r.shards(following: alice).isEmpty)
    }

    func testAFirstFollowStartsAtTheHeadAndTheLastUnfollowForgetsIt() {
        let r = registry(bus: true)
        func record(_ seq: Int64) -> ChangeRecord {
            ChangeRecord(change: Change(seq: seq, op: .delete(id: "n", appNotificationId: "x", reason: .deleted)),
                         before: nil, after: nil, at: 0)
        }
        r.follow(alice, shard: 0, head: 5)
        r.follow(alice, shard: 1, head: 9)  // not the first: the head stays 5
        XCTAssertFalse(r.sequence(alice, [record(6)]).gap)
        r.unfollow(alice, shard: 0)
        r.unfollow(alice, shard: 1)
        r.follow(alice, shard: 0)
        XCTAssertTrue(r.sequence(alice, [record(7)]).gap, "followed anew without a head: unknown, so a catch-up")
    }

    func testDevicesAreListedByUserAndForgottenOnceIdle() {
        let r = registry(bus: true)
        r.opened(alice, device: "phone", .websocket, now: 1_000)
        r.opened(alice, device: "laptop", .sse, now: 1_000)
        r.opened(bob, device: "phone", .websocket, now: 1_000)
        r.closed(alice, device: "laptop", .sse, now: 2_000)
        XCTAssertEqual(r.connectedDevices, [alice: ["phone", "laptop"], bob: ["phone"]])
        XCTAssertEqual(r.unsavedSeen, [alice: ["laptop"]])
        XCTAssertEqual(r.connections(alice, device: "laptop")?.lastSeenAt, 2_000)
        r.flushed(now: 3_000)
        XCTAssertEqual(r.unsavedSeen, [:])
        XCTAssertEqual(r.connectedDevices, [alice: ["phone"], bob: ["phone"]], "the closed laptop is forgotten")
        XCTAssertEqual(r.knownDevices, 2)
        XCTAssertEqual(r.connections(alice, device: "phone")?.transport(now: 3_000), .websocket)
    }
}
