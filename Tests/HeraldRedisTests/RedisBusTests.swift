import Foundation
import XCTest
import HeraldCore
import HeraldPorts
@testable import HeraldRedis

/// The Redis bus against a real redis-server (scripts/test-servers exports
/// HERALD_TEST_REDIS_URL and HERALD_TEST_REDIS_CTL); skipped without one.
final class RedisBusTests: XCTestCase {
    final class Receiver: BusReceiver, @unchecked Sendable {  // every field is under `cond`
        let cond = NSCondition()
        var records: [(UserKey, ChangeRecord)] = []
        var subscriptions = 0
        var devices: [(UserKey, String)] = []
        /// Users with no followers on this node.
        var unfollowed: Set<UserKey> = []

        func received(_ r: [(UserKey, ChangeRecord)]) { cond.lock(); records += r; cond.broadcast(); cond.unlock() }
        func subscribed() { cond.lock(); subscriptions += 1; cond.broadcast(); cond.unlock() }
        func deviceChanged(_ user: UserKey, deviceId: String) { cond.lock(); devices.append((user, deviceId)); cond.broadcast(); cond.unlock() }
        func follows(_ user: UserKey) -> Bool { cond.lock(); defer { cond.unlock() }; return !unfollowed.contains(user) }

        /// Waits (up to 10 s) until `done` holds.
        func wait(_ what: String, _ done: (Receiver) -> Bool) {
            let until = Date(timeIntervalSinceNow: 10)
            cond.lock()
            defer { cond.unlock() }
            while !done(self) { if !cond.wait(until: until) { return XCTFail("timed out waiting for \(what)") } }
        }
    }

    var endpoint: RedisEndpoint!

    override func setUpWithError() throws {
        guard let url = ProcessInfo.processInfo.environment["HERALD_TEST_REDIS_URL"] else {
            throw XCTSkip("HERALD_TEST_REDIS_URL is not set (scripts/test-servers)")
        }
        endpoint = try RedisEndpoint(url: url)
    }

    private func record(_ seq: Int64, tags: String? = nil) -> ChangeRecord {
        let n = Notification(id: "n_\(seq)", appNotificationId: "a\(seq)", userId: "u", payload: ["title": .string("t\(seq)")],
                             targetTags: tags.map { try! TagExpression.parse($0) }, createdAt: 1, updatedAt: 1, expiresAt: 2)
        return ChangeRecord(change: Change(seq: seq, op: .upsert(n)), before: nil, after: Presence(n), at: 1)
    }

    private func node() -> (RedisBus, Receiver) {
        let bus = RedisBus(endpoint), r = Receiver()
        bus.start(r, metrics: BusMetrics())
        r.wait("the first subscription") { $0.subscriptions == 1 }
        return (bus, r)
    }

    func testAPublishReachesTheOtherNodeWholeAndNotItself() {
        let (a, ra) = node(), (b, rb) = node()
        defer { a.stop(); b.stop() }
        let user = UserKey(app: "app", user: "u")
        // One by one, then a batch's worth in one call (one write).
        for seq: Int64 in 1...20 { a.publish([(user, record(seq, tags: seq == 7 ? "lang:it && !muted" : nil))]) }
        a.publish((21...50).map { (user, record($0)) })
        rb.wait("50 records") { $0.records.count == 50 }
        XCTAssertEqual(rb.records.map(\.1.seq), Array(1...50), "in publish order")
        let seven = rb.records[6].1, sent = record(7, tags: "lang:it && !muted")
        XCTAssertEqual(rb.records[6].0, user)
        XCTAssertEqual(seven.encoded, sent.encoded, "the bytes the committing node encoded")
        XCTAssertEqual(seven.change, sent.change)
        XCTAssertEqual(seven.after?.targeting.tags?.source, "lang:it && !muted")
        XCTAssertNil(seven.before)
        ra.cond.lock(); XCTAssertTrue(ra.records.isEmpty, "a node never hears itself"); ra.cond.unlock()
    }

    /// More than the socket takes at once (64 KiB records, published
    /// faster than Redis reads them): what the caller could not write goes
    /// out after, by the publisher, still in order, none twice.
    func testABurstLargerThanTheSocketArrivesWholeAndInOrder() {
        let (a, _) = node(), (b, rb) = node()
        defer { a.stop(); b.stop() }
        let user = UserKey(app: "app", user: "u")
        let big = String(repeating: "x", count: 64 * 1024)
        func large(_ seq: Int64) -> ChangeRecord {
            let n = Notification(id: "n_\(seq)", appNotificationId: "a\(seq)", userId: "u", payload: ["pad": .string(big)],
                                 createdAt: 1, updatedAt: 1, expiresAt: 2)
            return ChangeRecord(change: Change(seq: seq, op: .upsert(n)), before: nil, after: Presence(n), at: 1)
        }
        a.publish([(user, large(1))])
        rb.wait("the first record") { $0.records.count == 1 }  // the connection is up: later ones go straight out
        for seq: Int64 in 2...300 { a.publish([(user, large(seq))]) }
        rb.wait("300 records") { $0.records.count == 300 }
        XCTAssertEqual(rb.records.map(\.1.seq), Array(1...300))
        XCTAssertEqual(rb.records[299].1.encoded, large(300).encoded)
    }

    /// Every node hears every channel; the records of users it has no
    /// follower for are dropped undecoded, not handed on.
    func testRecordsOfUsersNotFollowedHereAreNotHandedOn() {
        let (a, _) = node(), (b, rb) = node()
        defer { a.stop(); b.stop() }
        let followed = UserKey(app: "app", user: "u"), other = UserKey(app: "app", user: "elsewhere")
        rb.cond.lock(); rb.unfollowed = [other]; rb.cond.unlock()
        for seq: Int64 in 1...20 {
            a.publish([(other, record(seq))])
            a.publish([(followed, record(seq))])
        }
        rb.wait("the followed user's 20 records") { $0.records.count >= 20 }
        XCTAssertEqual(rb.records.map(\.0), Array(repeating: followed, count: 20))
    }

    /// Redis killed (-9) and started again: both nodes reconnect and
    /// resubscribe on their own; what was published while it was away is
    /// held and sent once it is back.
    func testReconnectsAndResubscribesAfterRedisRestarts() throws {
        guard let ctl = ProcessInfo.processInfo.environment["HERALD_TEST_REDIS_CTL"] else {
            throw XCTSkip("HERALD_TEST_REDIS_CTL is not set")
        }
        let (a, ra) = node(), (b, rb) = node()
        defer { a.stop(); b.stop() }
        let user = UserKey(app: "app", user: "u")
        a.publish([(user, record(1))])
        rb.wait("the first record") { $0.records.count == 1 }
        try run(ctl, "kill")
        // Held by the publisher until Redis is back and b has resubscribed.
        a.publish([(user, record(2))])
        try run(ctl, "start")
        rb.wait("b's resubscription") { $0.subscriptions == 2 }
        ra.wait("a's resubscription") { $0.subscriptions == 2 }
        XCTAssertEqual(b.state, "connected")
        a.publish([(user, record(3))])
        rb.wait("records after the restart") { $0.records.map(\.1.seq).last == 3 }
        // Record 2 may have gone out before b resubscribed: then b's
        // catch-up from the store covers it. Nothing arrives twice or late.
        let seqs = rb.records.map(\.1.seq)
        XCTAssertTrue(seqs == [1, 2, 3] || seqs == [1, 3], "got \(seqs)")
    }

    /// Runs redis-cli against the test server; answers what it printed.
    @discardableResult private func redis(_ args: String) throws -> String {
        let url = try XCTUnwrap(ProcessInfo.processInfo.environment["HERALD_TEST_REDIS_URL"])
        let p = Process(), out = Pipe()
        p.executableURL = URL(fileURLWithPath: "/usr/bin/redis-cli")
        p.arguments = ["-u", url] + args.split(separator: " ").map(String.init)
        p.standardOutput = out
        try p.run()
        let text = String(decoding: out.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        p.waitUntilExit()
        return text
    }

    /// How many calls of `command` Redis refused so far (INFO commandstats).
    private func rejectedCalls(_ command: String) throws -> Int {
        let line = try redis("INFO commandstats").split(whereSeparator: \.isNewline).first { $0.hasPrefix("cmdstat_\(command):") } ?? ""
        let field = line.split(separator: ",").first { $0.hasPrefix("rejected_calls=") }
        return field.flatMap { Int($0.dropFirst("rejected_calls=".count)) } ?? 0
    }

    /// Waits (up to 10 s) for Redis to refuse `command` once more than `before`.
    private func waitForRefusal(of command: String, after before: Int) throws {
        let until = Date(timeIntervalSinceNow: 10)
        while try rejectedCalls(command) == before {
            guard Date() < until else { return XCTFail("Redis never refused \(command)") }
            usleep(20_000)
        }
    }

    /// A PUBLISH Redis answers with an error (-NOPERM here: an ACL took the
    /// right away) is not taken as sent: it goes again until Redis takes it.
    func testARecordRedisRefusesIsPublishedAgain() throws {
        let (a, _) = node(), (b, rb) = node()
        defer { _ = try? redis("ACL SETUSER default +publish"); a.stop(); b.stop() }
        let user = UserKey(app: "app", user: "u")
        let before = try rejectedCalls("publish")
        try redis("ACL SETUSER default -publish")
        a.publish([(user, record(1))])
        try waitForRefusal(of: "publish", after: before)
        try redis("ACL SETUSER default +publish")
        rb.wait("the refused record, published again") { $0.records.map(\.1.seq) == [1] }
    }

    /// A SUBSCRIBE Redis refuses (an ACL takes the channels away, which also
    /// drops the node's subscription) is tried again until Redis takes it;
    /// meanwhile the bus stops at once when asked.
    func testARefusedSubscriptionIsTriedAgainAndStopsWhenAsked() throws {
        let (a, ra) = node()
        defer { _ = try? redis("ACL SETUSER default allchannels") }
        var before = try rejectedCalls("subscribe")
        try redis("ACL SETUSER default resetchannels")
        try waitForRefusal(of: "subscribe", after: before)
        try redis("ACL SETUSER default allchannels")
        ra.wait("the subscription again") { $0.subscriptions == 2 }
        before = try rejectedCalls("subscribe")
        try redis("ACL SETUSER default resetchannels")
        try waitForRefusal(of: "subscribe", after: before)
        let stopped = DispatchSemaphore(value: 0)
        Thread.detachNewThread {
            a.stop()
            stopped.signal()
        }
        XCTAssertEqual(stopped.wait(timeout: .now() + 10), .success, "stop() returned")
    }

    func testURLForms() throws {
        let e = try RedisEndpoint(url: "redis://:s3cret@10.0.0.5:6380/2")
        XCTAssertEqual([e.host, "\(e.port)", e.password ?? "-", "\(e.db)"], ["10.0.0.5", "6380", "s3cret", "2"])
        XCTAssertNil(e.user)
        XCTAssertEqual(e.description, "redis://10.0.0.5:6380/2", "no password in logs")
        XCTAssertEqual(try RedisEndpoint(url: "redis://h").port, 6379)
        XCTAssertEqual(try RedisEndpoint(url: "redis://herald:pw@h:1").user, "herald")
        for bad in ["rediss://h:6379", "http://h", "redis://", "redis://h:0", "redis://h/x", "redis://pw@h"] {
            XCTAssertThrowsError(try RedisEndpoint(url: bad), bad)
        }
    }

    /// Runs `ctl arg` to its end. Not with Foundation's Process, whose
    /// waitUntilExit never returned once the script left redis-server running.
    private func run(_ ctl: String, _ arg: String) throws {
        var pid: pid_t = 0
        let argv = [strdup(ctl), strdup(arg), nil]
        defer { argv.forEach { free($0) } }
        XCTAssertEqual(posix_spawn(&pid, ctl, nil, nil, argv, environ), 0)
        var status: Int32 = 0
        waitpid(pid, &status, 0)
        XCTAssertEqual(status, 0, "\(ctl) \(arg)")
    }
}
