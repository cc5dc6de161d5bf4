import Foundation
import Synchronization
import XCTest
import HeraldCore
@testable import HeraldStores
import HeraldTestSupport

final class PostgresStoreConformanceTests: StoreConformanceTests {
    var database: PostgresTestDatabase?

    override func makeStore() throws -> NotificationStore? {
        database = try PostgresTestDatabase()
        return try PostgresStore(url: database!.url)
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
    func testPreferencesSavedPerUserWithAChange() throws { try checkPreferencesSavedPerUserWithAChange() }
    func testTapsWaitOutTheirSpacing() throws { try checkTapsWaitOutTheirSpacing() }
    func testSharedTokensAreReplacedOnlyInPlaceOfTheOneRead() throws { try checkSharedTokensAreReplacedOnlyInPlaceOfTheOneRead() }
    func testHeadsOfManyFeeds() throws { try checkHeadsOfManyFeeds() }
    func testDevicesOfManyUsers() throws { try checkDevicesOfManyUsers() }

    override func tearDown() {
        super.tearDown()  // closes the store first: nothing holds a lock on the schema
        database?.drop()
    }
}

/// What only a store shared by several gateway nodes must promise: one
/// epoch, one migration, seqs in commit order per user, expiry announced
/// once; and what a lost server looks like.
final class PostgresStoreTests: XCTestCase {
    var database: PostgresTestDatabase!
    let alice = UserKey(app: "app1", user: "alice")
    let t0: Millis = 1_800_000_000_000

    override func setUpWithError() throws { database = try PostgresTestDatabase() }
    override func tearDown() {
        database?.drop()
        super.tearDown()
    }

    func note(_ id: String, user: UserKey? = nil, expiresAt: Millis? = nil) -> Notification {
        Notification(id: id, appNotificationId: "a-" + id, userId: (user ?? alice).user, payload: ["title": "hi"],
                     createdAt: t0, updatedAt: t0, expiresAt: expiresAt ?? t0 + 86_400_000)
    }

    /// Runs `body(i)` on `count` threads that start together; rethrows the
    /// first failure. Each thread must use only objects of its own `i`.
    func concurrently(_ count: Int, _ body: @escaping (Int) throws -> Void) throws {
        // Threads of their own: a pool (concurrentPerform) may run them one
        // after another, and some wait for each other.
        let body = Unchecked(body)
        let start = DispatchSemaphore(value: 0), done = DispatchSemaphore(value: 0)
        let failures = Collected<Error>()
        for i in 0..<count {
            Thread.detachNewThread {
                start.wait()
                do { try body.value(i) } catch { failures.add(error) }
                done.signal()
            }
        }
        for _ in 0..<count { start.signal() }
        for _ in 0..<count { done.wait() }
        if let e = failures.values.first { throw e }
    }

    // MARK: Schema and epoch

    func testNodesShareOneEpochAndMigrateOnce() throws {
        let url = database.url
        let epochs = Collected<String>()
        try concurrently(4) { _ in epochs.add(try PostgresStore(url: url).epoch) }
        XCTAssertEqual(epochs.values.count, 4)
        XCTAssertEqual(Set(epochs.values).count, 1, "one epoch for every node of one database")
        let again = try PostgresStore(url: url)
        XCTAssertEqual(again.epoch, epochs.values.first, "the epoch lives as long as the database")
        XCTAssertTrue(again.epoch.hasPrefix("p-"))
        let versions = try again.db.query("SELECT version FROM herald_schema ORDER BY version")
        XCTAssertEqual((0..<versions.count).map { versions.int64($0, 0) }, Array(1...PostgresSchema.version),
                       "each migration ran once")

        // Another schema is another database as far as the store knows.
        let other = try PostgresTestDatabase()
        defer { other.drop() }
        XCTAssertNotEqual(try PostgresStore(url: other.url).epoch, again.epoch)
    }

    /// A table that outgrew its planner statistics (never analyzed, 1,200
    /// rows) is analyzed, once: not again for rows updated in place, nor
    /// one with a few rows.
    func testTablesThatOutgrewTheirStatisticsAreAnalyzedOnce() throws {
        let store = try PostgresStore(url: database.url)
        XCTAssertEqual(try store.refreshPlannerStatistics(), [])
        // Else autovacuum might analyze it first.
        try store.db.execute("ALTER TABLE feeds SET (autovacuum_enabled = false)")
        try store.begin()
        try store.claim((0..<1_200).map { UserKey(app: "app1", user: "u\($0)") })
        try store.commit()
        try store.saveDevice(alice, Device(deviceId: "d", lastSeenAt: 1))
        // A session reports its row counts to the statistics within a second
        // or so of its commit: until then nothing looks grown.
        var analyzed: [String] = []
        let deadline = Date().addingTimeInterval(20)
        while analyzed.isEmpty && Date() < deadline {
            analyzed = try store.refreshPlannerStatistics()
            if analyzed.isEmpty { Thread.sleep(forTimeInterval: 0.05) }
        }
        XCTAssertEqual(analyzed, ["feeds"])
        let stamped = try store.db.query(
            "SELECT relname FROM pg_stat_user_tables WHERE schemaname = current_schema() AND last_analyze IS NOT NULL")
        XCTAssertEqual((0..<stamped.count).map { stamped.text($0, 0) }, ["feeds"])
        XCTAssertEqual(try store.refreshPlannerStatistics(), [], "nothing outgrew its statistics since")
        try store.db.execute("UPDATE feeds SET head = head + 1")
        try store.db.execute("UPDATE feeds SET head = head + 1")
        func updated() throws -> Int64 {
            try store.db.query("SELECT n_mod_since_analyze FROM pg_stat_user_tables WHERE schemaname = current_schema() AND relname = 'feeds'").int64(0, 0)
        }
        while try updated() < 2_400 && Date() < deadline { Thread.sleep(forTimeInterval: 0.05) }
        XCTAssertEqual(try updated(), 2_400)
        XCTAssertEqual(try store.refreshPlannerStatistics(), [], "updated twice over, but no larger")
    }

    func testNewerSchemaIsRefused() throws {
        let store = try PostgresStore(url: database.url)
        try store.db.execute("INSERT INTO herald_schema (version) VALUES ($1)", [.int(PostgresSchema.version + 1)])
        XCTAssertThrowsError(try PostgresStore(url: database.url)) { e in
            XCTAssertTrue("\(e)".contains("newer than the \(PostgresSchema.version)"), "\(e)")
        }
    }

    func testBadURLIsRefusedBeforeConnecting() {
        XCTAssertNil(PostgresStore.describe(url: "postgres://h/db?nosuchoption=1"))
        XCTAssertEqual(PostgresStore.describe(url: "postgresql://u:secret@db.example:6432/herald"), "db.example:6432/herald")
        XCTAssertThrowsError(try PostgresStore(url: "postgres://herald@127.0.0.1:1/nothing")) { e in
            XCTAssertTrue("\(e)".contains("cannot connect"), "\(e)")
            XCTAssertFalse("\(e)".contains("secret"))
        }
    }

    // MARK: Two nodes

    /// Two nodes publish to one user at once, in batches; a third connection
    /// follows the feed like a device resuming by cursor after every read.
    /// Every seq is distinct, and the follower, which only ever asks for
    /// changes after the last seq it saw, sees every one: no seq commits
    /// after a larger one of the same user.
    func testTwoNodesPublishingToOneUserKeepSeqsInCommitOrder() throws {
        let url = database.url, alice = alice
        let nodes = [try PostgresStore(url: url), try PostgresStore(url: url)]
        let follower = try XCTUnwrap(nodes[0].makeReader())
        let published = Collected<Int64>()
        let followed = Collected<Int64>()
        let finished = Collected<Int>()
        let batches = 60
        try concurrently(3) { [self] i in
            if i == 2 {
                var cursor: Int64 = 0
                while true {
                    let last = finished.values.count == 2
                    for r in try follower.changes(alice, after: cursor, limit: 1000) {
                        followed.add(r.seq)
                        cursor = r.seq
                    }
                    if last { return }
                }
            }
            defer { finished.add(i) }
            let store = nodes[i]
            for b in 0..<batches {
                try store.begin()
                var seqs: [Int64] = []
                for k in 0..<(1 + b % 3) {
                    seqs.append(try store.upsert(alice, note("n_\(i)_\(b)_\(k)"), previous: nil, at: t0).seq)
                }
                try store.commit()
                XCTAssertEqual(seqs, seqs.sorted(), "one batch's seqs increase")
                published.add(contentsOf: seqs)
            }
        }
        XCTAssertEqual(published.values.count, 2 * (0..<batches).map { 1 + $0 % 3 }.reduce(0, +))
        XCTAssertEqual(Set(published.values).count, published.values.count, "every seq distinct")
        XCTAssertEqual(followed.values, published.values.sorted(), "a follower by cursor misses no seq")
        XCTAssertEqual(try nodes[1].feed(alice).head, published.values.max())
    }

    /// Two nodes sweep the same due notifications at once: each is deleted
    /// and announced by one of them only.
    func testTwoNodesAnnounceEachExpiryOnce() throws {
        let (users, announced) = try sweepOnTwoNodes(.expiry) { n, k in n.expiresAt = t0 + Millis(k) }
        XCTAssertEqual(announced.count, 200, "announced once each")
        XCTAssertEqual(Set(announced).count, 200)
        var tombstones = 0
        for u in users {
            tombstones += try PostgresStore(url: database.url).changes(u, after: 0, limit: 1000).filter {
                if case .delete(_, _, .expired) = $0.change.op { return true } else { return false }
            }.count
        }
        XCTAssertEqual(tombstones, 200)
    }

    /// Two nodes wake the same snoozed notifications at once (SPEC section
    /// 11: one node wakes each): each wakes once, one version up.
    func testTwoNodesWakeEachSnoozeOnce() throws {
        let (users, woken) = try sweepOnTwoNodes(.wake) { n, k in
            n.userActionState = .snoozed
            n.snoozedUntil = t0 + Millis(k)
        }
        XCTAssertEqual(woken.count, 200, "woken once each")
        XCTAssertEqual(Set(woken).count, 200)
        let store = try PostgresStore(url: database.url)
        for u in users {
            for n in try store.history(u, after: nil, limit: 100) {
                XCTAssertEqual(n.userActionState, .noInteraction, n.id)
                XCTAssertEqual(n.version, 2, n.id)
            }
        }
    }

    /// 200 notifications of 10 users, each made due by `due`, swept by two
    /// nodes at once in transactions of at most 7; the users, and the ids
    /// each node's sweep changed.
    private func sweepOnTwoNodes(_ deadline: Deadline, due: (inout Notification, Int) -> Void) throws -> ([UserKey], [String]) {
        let url = database.url
        let nodes = [try PostgresStore(url: url), try PostgresStore(url: url)]
        let users = (0..<10).map { UserKey(app: "app1", user: "u\($0)") }
        try nodes[0].begin()
        for k in 0..<200 {
            let u = users[k % users.count]
            var n = note("n_\(k)", user: u)
            due(&n, k)
            _ = try nodes[0].upsert(u, n, previous: nil, at: t0)
        }
        try nodes[0].commit()
        let swept = Collected<String>()
        let now = t0 + 1000
        try concurrently(2) { i in
            let store = nodes[i]
            while true {
                try store.begin()
                let found = try store.due(deadline, until: now, limit: 7)
                for (u, n) in found {
                    switch deadline {
                    case .expiry: _ = try store.delete(u, n, reason: .expired, at: now)
                    case .wake: _ = try store.upsert(u, n.woken(at: now), previous: n, at: now)
                    }
                }
                try store.commit()
                swept.add(contentsOf: found.map(\.1.id))
                // Nothing found may mean the other node holds what is left
                // (skipped, not waited for): done only once nothing is due.
                if found.isEmpty, try (store.next(deadline)).map({ $0 > now }) ?? true { break }
            }
        }
        XCTAssertEqual(try nodes[1].due(deadline, until: now, limit: 10).count, 0)
        return (users, swept.values)
    }

    /// The database computes a user's partition as the gateway does
    /// (`Partition.index`), for any count of partitions and any ids.
    func testTheDatabaseFindsEachUsersPartitionAsTheGatewayDoes() throws {
        let store = try PostgresStore(url: database.url)
        var rng = SplitMix64(seed: 32)
        let alphabet = Array("ABCXYZabcxyz0189._@:-")
        func id(_ max: Int) -> String { String((0..<rng.range(1, max)).map { _ in alphabet[rng.below(alphabet.count)] }) }
        for k in 0..<300 {
            let app = k % 3 == 0 ? "com.example.todo" : id(64)
            let user = id(128)
            let count = 2 + k % 15
            let r = try store.db.query("SELECT herald_partition($1, $2, $3)", [.text(app), .text(user), .int(Int64(count))])
            XCTAssertEqual(Int(r.int64(0, 0)), Partition.index(of: UserKey(app: app, user: user), among: count), "\(app) \(user) of \(count)")
        }
    }

    /// Partitions of one node share the database: each sweeps only its own
    /// users' expired notifications, and together they sweep them all.
    func testEachPartitionSweepsItsOwnUsersExpiry() throws {
        let partitions = [try PostgresStore(url: database.url), try PostgresStore(url: database.url)]
        let users = (0..<20).map { UserKey(app: "app1", user: "u\($0)") }
        try partitions[0].begin()
        for (k, u) in users.enumerated() {
            _ = try partitions[0].upsert(u, note("n_\(k)", user: u, expiresAt: t0 + Millis(k)), previous: nil, at: t0)
        }
        try partitions[0].commit()
        var swept: [String] = []
        for (p, store) in partitions.enumerated() {
            let share = Partition(index: p, count: 2)
            let due = try store.due(.expiry, until: t0 + 1000, limit: 100, in: share)
            XCTAssertFalse(due.isEmpty, "20 users over 2 partitions")
            for (u, _) in due { XCTAssertTrue(share.owns(u), "\(u) is not partition \(p)'s") }
            swept += due.map(\.1.id)
        }
        XCTAssertEqual(Set(swept), Set((0..<20).map { "n_\($0)" }), "each once, by its partition")
        XCTAssertEqual(swept.count, 20)
    }

    /// One node prunes over and over while another changes, deletes and
    /// publishes again the same notifications: every notification stays
    /// readable as last written, and no change is kept that nothing points
    /// at, whatever the interleaving. (The prune that judged pointers before
    /// taking its locks kept such a change in about one run in 25.)
    func testPruningBesideAnotherNodesWritesKeepsWhatIsPointedAtOnly() throws {
        let url = database.url, alice = alice, t0 = t0
        let nodes = [try PostgresStore(url: url), try PostgresStore(url: url)]
        let rounds = 300
        var last: [String: Notification] = [:]
        try concurrently(2) { [self] i in
            let store = nodes[i]
            for k in 1...rounds {
                if i == 1 {
                    _ = try store.pruneChanges(before: t0 + Millis(k))
                    continue
                }
                let id = "n_\(k % 5)"
                if k % 7 == 0, let n = try store.notification(alice, id: id) {
                    _ = try store.delete(alice, n, reason: .deleted, at: t0 + Millis(k))
                    last[id] = nil
                    continue
                }
                var n = try store.notification(alice, id: id) ?? note(id)
                n.version += 1
                n.readState = k % 2 == 0 ? .read : .unread
                _ = try store.upsert(alice, n, previous: nil, at: t0 + Millis(k))
                last[id] = n
            }
        }
        _ = try nodes[1].pruneChanges(before: t0 + Millis(rounds + 1))
        XCTAssertEqual(try nodes[1].history(alice, after: nil, limit: 10).sorted { $0.id < $1.id },
                       last.values.sorted { $0.id < $1.id })
        let db = nodes[1].db
        XCTAssertEqual(try db.query("""
            SELECT count(*) FROM changes c WHERE c.at IS NULL AND NOT EXISTS (
                SELECT 1 FROM notifications n WHERE n.app = c.app AND n.user_id = c.user_id AND n.id = c.notification_id AND n.seq = c.seq)
            """).int64(0, 0), 0, "a kept change nothing points at")
        XCTAssertEqual(try db.query("""
            SELECT count(*) FROM notifications n WHERE n.seq IS NOT NULL AND NOT EXISTS (
                SELECT 1 FROM changes c WHERE c.app = n.app AND c.user_id = n.user_id AND c.seq = n.seq)
            """).int64(0, 0), 0, "a notification whose change is gone")
        XCTAssertEqual(try db.query("SELECT count(*) FROM changes WHERE at IS NOT NULL").int64(0, 0), 0, "all pruned at the end")
    }

    /// One node sweeps due notifications over and over while another keeps
    /// changing them: each sweep reads every due notification as it is.
    func testSweepingBesideAnotherNodesWritesReadsEachNotificationAsItIs() throws {
        let url = database.url, alice = alice, t0 = t0
        let nodes = [try PostgresStore(url: url), try PostgresStore(url: url)]
        for k in 0..<5 { _ = try nodes[0].upsert(alice, note("n_\(k)", expiresAt: t0), previous: nil, at: t0) }
        try concurrently(2) { i in
            let store = nodes[i]
            for k in 1...300 {
                if i == 1 {
                    try store.begin()
                    defer { store.rollback() }
                    let due = try store.due(.expiry, until: t0 + 1, limit: 10)
                    XCTAssertTrue(due.allSatisfy { $0.1.expiresAt == t0 && $0.0 == alice })
                    continue
                }
                var n = try XCTUnwrap(store.notification(alice, id: "n_\(k % 5)"))
                n.version += 1
                n.readState = k % 2 == 0 ? .read : .unread
                _ = try store.upsert(alice, n, previous: nil, at: t0 + Millis(k))
            }
        }
        XCTAssertEqual(try nodes[1].due(.expiry, until: t0 + 1, limit: 10).count, 5)
    }

    /// A node's read-modify-write of a user waits for another node's open
    /// transaction on that user, then reads what it committed.
    func testAUsersTransactionsRunOneAfterAnotherAcrossNodes() throws {
        let url = database.url, alice = alice
        let a = try PostgresStore(url: url), b = try PostgresStore(url: url)
        _ = try a.upsert(alice, note("n_1"), previous: nil, at: t0)
        try a.begin()
        var n = try XCTUnwrap(a.notification(alice, id: "n_1"))
        let bRead = Collected<Int64>()
        let bDone = DispatchSemaphore(value: 0)
        let other = Unchecked(b)
        Thread.detachNewThread {
            let b = other.value
            do {
                try b.begin()
                if let m = try b.notification(alice, id: "n_1") { bRead.add(m.version) }
                try b.commit()
            } catch { XCTFail("\(error)") }
            bDone.signal()
        }
        XCTAssertEqual(bDone.wait(timeout: .now() + 0.5), .timedOut, "node b waits for node a's transaction on alice")
        n.version += 1
        _ = try a.upsert(alice, n, previous: n, at: t0 + 1)
        try a.commit()
        XCTAssertEqual(bDone.wait(timeout: .now() + 10), .success)
        XCTAssertEqual(bRead.values, [2], "then reads what a committed")
    }

    /// The session ends while COMMIT runs (here: in a deferred trigger that
    /// sleeps, ended by `pg_terminate_backend`, as a crash or a cut network
    /// would): the store cannot know whether the transaction committed, and
    /// says so, for the engine to catch the user's devices up from the store.
    func testACommitWhoseAnswerIsLostSaysItsOutcomeIsUnknown() throws {
        let url = database.url, alice = alice
        let store = try PostgresStore(url: url)
        let admin = try PostgresConnection(url: url)
        defer { admin.close() }
        try admin.script("""
            CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN PERFORM pg_sleep(60); RETURN NULL; END $$;
            CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON changes
                DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit();
            """)
        try store.begin()
        _ = try store.upsert(alice, note("n_1"), previous: nil, at: t0)
        let ended = DispatchSemaphore(value: 0)
        let killer = Unchecked(admin)
        Thread.detachNewThread {
            // Waits for the event (the COMMIT sleeping), with a deadline.
            let deadline = Date().addingTimeInterval(30)
            while Date() < deadline {
                let rows = try? killer.value.query(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query = 'COMMIT' AND wait_event = 'PgSleep'")
                if let rows, rows.count > 0 { break }
                usleep(20_000)
            }
            ended.signal()
        }
        XCTAssertThrowsError(try store.commit()) { e in
            XCTAssertEqual((e as? StoreError)?.outcomeUnknown, true, "\(e)")
        }
        XCTAssertEqual(ended.wait(timeout: .now() + 40), .success)
        // The next transaction runs on a new session.
        try admin.script("DROP TRIGGER slow_commit ON changes")
        try store.begin()
        _ = try store.upsert(alice, note("n_2"), previous: nil, at: t0)
        try store.commit()
        XCTAssertNotNil(try store.notification(alice, id: "n_2"))
    }

    /// The server lets a vanished node's session go within about 30 s (its
    /// TCP keepalives and user timeout, as Herald's side has them), unless
    /// something set them already: here the URL, for the idle time.
    func testTheServerSideOfASessionHasTCPBounds() throws {
        func show(_ c: PostgresConnection, _ name: String) throws -> String? { try c.query("SHOW \(name)").text(0, 0) }
        let plain = try PostgresConnection(url: database.url)
        defer { plain.close() }
        XCTAssertEqual(try show(plain, "tcp_keepalives_idle"), "15")
        XCTAssertEqual(try show(plain, "tcp_keepalives_interval"), "5")
        XCTAssertEqual(try show(plain, "tcp_keepalives_count"), "3")
        XCTAssertEqual(try show(plain, "tcp_user_timeout"), "15000")
        XCTAssertEqual(try show(plain, "lock_timeout"), "15s", "a lock held longer is a frozen node's (fenced)")
        XCTAssertEqual(try show(plain, "application_name"), "herald")
        try plain.name("herald/node1")
        XCTAssertEqual(try show(plain, "application_name"), "herald/node1")
        let own = try PostgresConnection(url: database.url + "%20-ctcp_keepalives_idle%3D60")
        defer { own.close() }
        XCTAssertEqual(try show(own, "tcp_keepalives_idle"), "60", "the URL's own value stays")
        XCTAssertEqual(try show(own, "tcp_keepalives_count"), "3")
    }

    /// Only a frozen node's session is ended: named after a node whose lease
    /// lapsed, inside a transaction, silent for the threshold and waiting
    /// for its client. Not one that keeps talking (a long maintenance
    /// transaction), not one with a live lease, not one outside a
    /// transaction, and never a session of the store itself.
    func testOnlyAFrozenNodesSessionIsFenced() throws {
        let store = try PostgresStore(url: database.url)
        func session(_ node: String, lease: String, inTransaction: Bool) throws -> PostgresConnection {
            let c = try PostgresConnection(url: database.url)
            try c.name("herald/" + node)
            try c.execute("INSERT INTO herald_nodes (node, lease_until) VALUES ($1, now() + $2::interval)", [.text(node), .text(lease)])
            if inTransaction { try c.script("BEGIN; SELECT 1") }
            return c
        }
        let frozen = try session("frozen", lease: "-1 second", inTransaction: true)
        let busy = try session("busy", lease: "-1 second", inTransaction: true)
        let leased = try session("leased", lease: "1 hour", inTransaction: true)
        let idle = try session("idle", lease: "-1 second", inTransaction: false)
        defer { for c in [frozen, busy, leased, idle] { c.close() } }
        let silence: Int64 = 3_000
        // Until the frozen session has been silent past the threshold, as the server sees it.
        let observer = try PostgresConnection(url: database.url)
        defer { observer.close() }
        let deadline = Date().addingTimeInterval(30)
        while Date() < deadline, try observer.query("""
            SELECT count(*) FROM pg_stat_activity WHERE application_name = 'herald/frozen'
            AND query_start < now() - $1 * interval '1 millisecond'
            """, [.int(silence)]).int64(0, 0) == 0 {
            Thread.sleep(forTimeInterval: 0.1)
        }
        try busy.query("SELECT 1")  // a statement just now, as a busy engine sends
        XCTAssertEqual(store.fenceFrozenNodes(silentFor: silence), ["frozen"])
        XCTAssertThrowsError(try frozen.query("SELECT 1"), "its session was ended")
        for c in [busy, leased, idle] { XCTAssertEqual(try c.query("SELECT 1").count, 1) }
    }

    /// `claim` locks every user it is given at once, past its 500-user
    /// statements and whatever the ids hold, creating their feeds at head 0.
    func testClaimLocksEveryUserGivenAtOnce() throws {
        let url = database.url
        let a = try PostgresStore(url: url), b = try PostgresStore(url: url)
        let users = (0..<1_001).map { UserKey(app: "app1", user: "u\($0)") } + [UserKey(app: "app1", user: #"q"\{,}"#)]
        try a.begin()
        try a.claim(users.reversed())
        let bDone = DispatchSemaphore(value: 0)
        let other = Unchecked(b), last = users[1_000], odd = users[1_001]
        Thread.detachNewThread {
            do {
                try other.value.begin()
                XCTAssertEqual(try other.value.feed(last).head, 0)
                XCTAssertEqual(try other.value.feed(odd).head, 0)
                try other.value.commit()
            } catch { XCTFail("\(error)") }
            bDone.signal()
        }
        XCTAssertEqual(bDone.wait(timeout: .now() + 0.5), .timedOut, "node b waits for node a's claim")
        try a.commit()
        XCTAssertEqual(bDone.wait(timeout: .now() + 10), .success)
        _ = try a.upsert(odd, note("n_1"), previous: nil, at: t0)
        XCTAssertEqual(try a.feed(odd).head, 1)
    }

    /// What `claim` reads ahead answers the transaction's lookups, and its
    /// own writes keep those answers current.
    func testClaimReadsLookupsAheadAndWritesKeepThemCurrent() throws {
        let store = try PostgresStore(url: database.url)
        let bob = UserKey(app: "app1", user: "bob")
        _ = try store.upsert(alice, note("n_1"), previous: nil, at: t0)
        try store.begin()
        try store.claim([], lookups: [.id(alice, "n_1"), .appNotificationId(alice, "a-n_1"), .id(alice, "n_9"),
                                      .appNotificationId(bob, "a-n_2")])
        XCTAssertEqual(try store.notification(alice, id: "n_1")?.version, 1)
        XCTAssertEqual(try store.notification(alice, appNotificationId: "a-n_1")?.id, "n_1")
        XCTAssertNil(try store.notification(alice, id: "n_9"))
        XCTAssertNil(try store.notification(bob, appNotificationId: "a-n_2"))
        var n = note("n_1")
        n.version = 2
        _ = try store.upsert(alice, n, previous: note("n_1"), at: t0 + 1)
        _ = try store.upsert(bob, note("n_2", user: bob), previous: nil, at: t0 + 1)
        XCTAssertEqual(try store.notification(alice, appNotificationId: "a-n_1")?.version, 2)
        XCTAssertEqual(try store.notification(bob, appNotificationId: "a-n_2")?.id, "n_2")
        _ = try store.delete(alice, n, reason: .deleted, at: t0 + 2)
        XCTAssertNil(try store.notification(alice, id: "n_1"))
        XCTAssertNil(try store.notification(alice, appNotificationId: "a-n_1"))
        try store.commit()
        XCTAssertNil(try store.notification(alice, id: "n_1"))
        XCTAssertEqual(try store.notification(bob, id: "n_2")?.appNotificationId, "a-n_2")
        XCTAssertEqual(try store.feed(alice).head, 3)
    }

    /// A batch whose users and notifications the node knows from its last
    /// commits reads nothing: BEGIN, the locks, the check of the heads, the
    /// writes and COMMIT go out together. Its users' preferences too, which
    /// every publish reads (SPEC section 12).
    func testABatchOfWhatTheNodeKnowsCostsOneRoundTrip() throws {
        let store = try PostgresStore(url: database.url)
        _ = try store.upsert(alice, note("n_1"), previous: nil, at: t0)
        var n = note("n_1")
        func update() throws -> Int {
            let before = store.db.roundTrips
            try store.begin()
            try store.claim([alice], lookups: [.id(alice, "n_1")])
            XCTAssertEqual(try store.preferences(alice), .unsaved)
            let previous = try XCTUnwrap(store.notification(alice, id: "n_1"))
            XCTAssertEqual(previous, n)
            n.version += 1
            n.readState = previous.readState == .read ? .unread : .read
            _ = try store.upsert(alice, n, previous: previous, at: t0)
            try store.commit()
            return store.db.roundTrips - before
        }
        _ = try update()  // prepares the statements: once per session
        XCTAssertEqual(try update(), 1)
        XCTAssertEqual(try update(), 1)
        // Not known (other users, never written here): the claim reads.
        func readingClaim(_ user: String) throws -> Int {
            let u = UserKey(app: "app1", user: user), before = store.db.roundTrips
            try store.begin()
            try store.claim([u], lookups: [.id(u, "n_1")])
            XCTAssertNil(try store.notification(u, id: "n_1"))
            try store.commit()
            return store.db.roundTrips - before
        }
        _ = try readingClaim("bob")
        XCTAssertEqual(try readingClaim("carol"), 2)
        XCTAssertEqual(try store.changes(alice, after: 0, limit: 10).map(\.seq), [1, 2, 3, 4])
        XCTAssertEqual(try store.notification(alice, id: "n_1"), n)
    }

    /// Another node moved the feed since this one last wrote it: the batch
    /// that took the old head from memory fails as a conflict at its
    /// commit, nothing of it committed, and run again it reads.
    func testABatchOnAHeadAnotherNodeMovedFailsAsAConflictAndRunsAgainReading() throws {
        let a = try PostgresStore(url: database.url), b = try PostgresStore(url: database.url)
        _ = try a.upsert(alice, note("n_1"), previous: nil, at: t0)
        var moved = note("n_1")
        moved.version = 2
        moved.userActionState = .dismissed
        _ = try b.upsert(alice, moved, previous: note("n_1"), at: t0 + 1)
        func markRead() throws {
            try a.begin()
            try a.claim([alice], lookups: [.id(alice, "n_1")])
            var n = try XCTUnwrap(a.notification(alice, id: "n_1"))
            let previous = n
            n.version += 1
            n.readState = .read
            _ = try a.upsert(alice, n, previous: previous, at: t0 + 2)
            try a.commit()
        }
        XCTAssertThrowsError(try markRead()) { e in
            XCTAssertTrue((e as? StoreError)?.conflict == true, "\(e)")
            XCTAssertTrue("\(e)".contains("a feed moved"), "\(e)")
        }
        a.rollback()
        XCTAssertEqual(try a.feed(alice).head, 2, "nothing of it committed")
        try markRead()
        let stored = try XCTUnwrap(a.notification(alice, id: "n_1"))
        XCTAssertEqual(stored.version, 3)
        XCTAssertEqual(stored.userActionState, .dismissed, "node b's change kept")
        XCTAssertEqual(stored.readState, .read)
        XCTAssertEqual(try b.changes(alice, after: 0, limit: 10).map(\.seq), [1, 2, 3])
    }

    /// Changes another node committed, heard over the bus, keep what this
    /// node knows current: its next batch of that user reads nothing.
    func testChangesHeardFromAnotherNodeKeepWhatTheNodeKnows() throws {
        let a = try PostgresStore(url: database.url), b = try PostgresStore(url: database.url)
        _ = try a.upsert(alice, note("n_1"), previous: nil, at: t0)
        // A batch from memory first: it prepares its statements (once per session).
        try a.begin()
        try a.claim([alice], lookups: [.id(alice, "n_1")])
        try a.commit()
        var n = note("n_1")
        n.version = 2
        n.readState = .read
        a.noteCommitted(alice, [try b.upsert(alice, n, previous: note("n_1"), at: t0 + 1),
                                try b.upsert(alice, note("n_2"), previous: nil, at: t0 + 1)])
        let before = a.db.roundTrips
        try a.begin()
        try a.claim([alice], lookups: [.id(alice, "n_1"), .appNotificationId(alice, "a-n_2")])
        XCTAssertEqual(try a.notification(alice, id: "n_1"), n)
        XCTAssertEqual(try a.notification(alice, appNotificationId: "a-n_2")?.id, "n_2")
        var m = n
        m.version = 3
        m.userActionState = .dismissed
        _ = try a.upsert(alice, m, previous: n, at: t0 + 2)
        try a.commit()
        XCTAssertEqual(a.db.roundTrips - before, 1)
        XCTAssertEqual(try a.changes(alice, after: 0, limit: 10).map(\.seq), [1, 2, 3, 4])
        XCTAssertEqual(try b.notification(alice, id: "n_1"), m)
    }

    /// A write moves the counts in its one statement and leaves a row that
    /// reaches 0 in place; readers skip it and pruning drops it.
    func testCountsRowsLeftAtZeroAreSkippedThenPruned() throws {
        let store = try PostgresStore(url: database.url)
        _ = try store.upsert(alice, note("n_1"), previous: nil, at: t0)
        XCTAssertEqual(try store.counts(alice).map(\.total), [1])
        _ = try store.delete(alice, note("n_1"), reason: .deleted, at: t0 + 1)
        XCTAssertEqual(try store.counts(alice).map(\.total), [])
        XCTAssertEqual(try store.makeReader()?.counts(alice).map(\.total), [])
        XCTAssertEqual(try store.db.query("SELECT count(*) FROM counts").int64(0, 0), 1)
        _ = try store.pruneChanges(before: t0)
        XCTAssertEqual(try store.db.query("SELECT count(*) FROM counts").int64(0, 0), 0)
        // The sweep scans the table, so it runs every `countsSweepEvery`, not with every call.
        _ = try store.upsert(alice, note("n_2"), previous: nil, at: t0 + 2)
        _ = try store.delete(alice, note("n_2"), reason: .deleted, at: t0 + 3)
        _ = try store.pruneChanges(before: t0 + PostgresStore.countsSweepEvery - 1)
        XCTAssertEqual(try store.db.query("SELECT count(*) FROM counts").int64(0, 0), 1)
        _ = try store.pruneChanges(before: t0 + PostgresStore.countsSweepEvery)
        XCTAssertEqual(try store.db.query("SELECT count(*) FROM counts").int64(0, 0), 0)
    }

    /// A notification's JSON is written once, in its change, which a prune
    /// keeps (below the floor, `at` NULL) until the notification changes or goes.
    func testANotificationsJSONIsWrittenOnceAndItsChangeKept() throws {
        let store = try PostgresStore(url: database.url)
        func rows(_ sql: String) throws -> Int64 { try store.db.query(sql).int64(0, 0) }
        let big: JSONObject = ["text": .string(String(repeating: "x", count: 60_000))]
        for k in 0..<3 {
            var n = note("n_\(k)")
            n.payload = big
            _ = try store.upsert(alice, n, previous: nil, at: t0)
        }
        XCTAssertEqual(try rows("SELECT sum(length(json)) FROM notifications"), 0)
        XCTAssertEqual(try store.pruneChanges(before: t0 + 1), 3)
        XCTAssertEqual(try store.feed(alice), FeedState(head: 3, floor: 3))
        XCTAssertEqual(try store.changes(alice, after: 0, limit: 10).count, 0, "kept changes are not served")
        XCTAssertEqual(try rows("SELECT count(*) FROM changes WHERE at IS NULL"), 3)
        XCTAssertEqual(try store.pruneChanges(before: t0 + 2), 0, "kept changes are out of later passes")
        XCTAssertEqual(try store.history(alice, after: nil, limit: 10).map(\.payload), Array(repeating: big, count: 3))
        XCTAssertEqual(try store.makeReader()?.read { r throws(StoreError) in try r.notification(alice, id: "n_1") }?.payload, big)

        var n0 = try XCTUnwrap(store.notification(alice, id: "n_0"))
        n0.readState = .read
        n0.version += 1
        _ = try store.upsert(alice, n0, previous: nil, at: t0 + 5)
        _ = try store.delete(alice, try XCTUnwrap(store.notification(alice, id: "n_1")), reason: .deleted, at: t0 + 5)
        XCTAssertEqual(try rows("SELECT count(*) FROM changes WHERE at IS NULL"), 1, "n_2's stays")
        XCTAssertEqual(try store.changes(alice, after: 3, limit: 10).map(\.seq), [4, 5])
        XCTAssertEqual(try store.notification(alice, id: "n_0"), n0)
        XCTAssertEqual(try store.pruneChanges(before: t0 + 10), 2)
        XCTAssertEqual(try rows("SELECT count(*) FROM changes"), 2, "those n_0 and n_2 point at")
        XCTAssertEqual(try store.history(alice, after: nil, limit: 10).map(\.id).sorted(), ["n_0", "n_2"])
    }

    /// Turns a database of this version into what version 4 wrote: no push handles, no outbox, no tap spacing, no shared tokens.
    func downgradeToVersion4(_ store: PostgresStore) throws {
        try downgradeToVersion8(store)
        try store.db.script("""
            DROP FUNCTION herald_partition; DROP TABLE push_tap_spacing; DROP TABLE shared_tokens;
            DROP TABLE push_outbox; DROP INDEX devices_by_push_key;
            ALTER TABLE devices DROP COLUMN push; ALTER TABLE devices DROP COLUMN push_key;
            DELETE FROM herald_schema WHERE version >= 5;
            """)
    }

    /// Turns a database of this version into what version 12 wrote: no webhook outbox.
    func downgradeToVersion12(_ store: PostgresStore) throws {
        // The push outbox's count as version 9 made it: its own function.
        try store.db.script("""
            DROP TABLE webhook_outbox; DROP TABLE webhook_outbox_size; DROP FUNCTION herald_outbox_size CASCADE;
            DROP TABLE push_outbox_size; DELETE FROM herald_schema WHERE version >= 13;
            """)
        try store.db.script(PostgresSchema.migrations[8])
    }

    /// Version 13 adds the webhook outbox, empty and counted from 0, and
    /// moves the push outbox's count to the function both share: the
    /// pushes waiting stay counted, and so are those added after.
    func testMigrationFromVersion12StartsAnEmptyCountedWebhookOutbox() throws {
        let tap = PushMessage(kind: .tap, op: .state, cursor: 1, epoch: "e", notificationId: nil, expiresAt: t0 + 86_400_000)
        do {
            let old = try PostgresStore(url: database.url)
            try old.begin()
            try old.enqueuePush(alice, deviceId: "phone", tap, at: t0, claimUntil: nil)
            try old.commit()
            try downgradeToVersion12(old)
        }
        let store = try PostgresStore(url: database.url)
        XCTAssertEqual(try store.db.query("SELECT max(version) FROM herald_schema").int64(0, 0), PostgresSchema.version)
        XCTAssertEqual(try store.pendingWebhooks(), 0)
        XCTAssertEqual(try store.pendingPushes(), 1)
        try store.begin()
        try store.enqueueWebhook(app: "a", url: "http://h", eventId: "msg_1", body: Array("{}".utf8), at: t0)
        try store.enqueuePush(alice, deviceId: "tablet", tap, at: t0, claimUntil: nil)
        try store.commit()
        XCTAssertEqual(try store.pendingWebhooks(), 1)
        XCTAssertEqual(try store.pendingPushes(), 2)
    }

    /// Turns a database of this version into what version 11 wrote: no
    /// preferences (and no save of them in a feed).
    func downgradeToVersion11(_ store: PostgresStore) throws {
        try downgradeToVersion12(store)
        try store.db.script("""
            DROP TABLE preferences; DELETE FROM changes WHERE change LIKE '%"op":"preferences"%';
            DELETE FROM herald_schema WHERE version >= 12;
            """)
    }

    /// Turns a database of this version into what version 10 wrote: no
    /// `snoozedUntil`, no wake index.
    func downgradeToVersion10(_ store: PostgresStore) throws {
        try downgradeToVersion11(store)
        try store.db.script(withoutSnoozedUntilInTheStoredJSON + """
            DROP INDEX notifications_wake; ALTER TABLE notifications DROP COLUMN snoozed_until;
            DELETE FROM herald_schema WHERE version >= 11;
            """)
    }

    /// Turns a database of this version into what version 9 wrote: no
    /// `seenState` in the stored JSON, no seen_state or unseen columns.
    func downgradeToVersion9(_ store: PostgresStore) throws {
        try downgradeToVersion10(store)
        try store.db.script(withoutSeenStateInTheStoredJSON + """
            ALTER TABLE notifications DROP COLUMN seen_state; ALTER TABLE counts DROP COLUMN unseen;
            ALTER TABLE changes DROP COLUMN before_unseen, DROP COLUMN after_unseen;
            DELETE FROM herald_schema WHERE version >= 10;
            """)
    }

    func downgradeToVersion8(_ store: PostgresStore) throws {
        try downgradeToVersion9(store)
        try store.db.script("""
            DROP TABLE push_outbox_size; DROP FUNCTION herald_push_outbox_size CASCADE;
            DELETE FROM herald_schema WHERE version >= 9;
            """)
    }

    /// Turns a database of this version into what version 2 wrote: each
    /// notification's JSON in its row.
    func downgradeToVersion2(_ store: PostgresStore) throws {
        try downgradeToVersion4(store)
        let prefix = #"length('{"seq":' || c.seq || ',"op":"upsert","notification":')"#
        try store.db.script("""
            UPDATE notifications n SET json = substr(c.change, \(prefix) + 1, length(c.change) - \(prefix) - 1)
                FROM changes c WHERE c.app = n.app AND c.user_id = n.user_id AND c.seq = n.seq;
            ALTER TABLE notifications DROP COLUMN seq; ALTER TABLE changes DROP COLUMN notification_id;
            ALTER TABLE changes ALTER COLUMN at SET NOT NULL; DELETE FROM herald_schema WHERE version >= 3;
            DROP FUNCTION herald_expect_heads;
            """)
    }

    /// Nodes of an older Herald would misread what a newer schema holds: an
    /// upgrade waits until none holds a live lease.
    func testAnUpgradeWaitsForEveryNodeToStop() throws {
        do {
            let store = try PostgresStore(url: database.url)
            _ = try store.upsert(alice, note("n_0"), previous: nil, at: t0)
            try downgradeToVersion2(store)
            _ = try store.renewLease(node: "old-node", millis: 60_000)
        }
        XCTAssertThrowsError(try PostgresStore(url: database.url)) { e in
            XCTAssertTrue("\(e)".contains("1 gateway node(s) or partitions of one are running on this database at schema version 2"), "\(e)")
        }
        let admin = try PostgresConnection(url: database.url)
        XCTAssertEqual(try admin.query("SELECT max(version) FROM herald_schema").int64(0, 0), 2, "nothing was changed")
        try admin.execute("UPDATE herald_nodes SET lease_until = now() - interval '1 second'")
        let store = try PostgresStore(url: database.url)
        XCTAssertEqual(try store.db.query("SELECT max(version) FROM herald_schema").int64(0, 0), PostgresSchema.version)
        XCTAssertEqual(try store.notification(alice, id: "n_0"), note("n_0"))
    }

    /// A store on the database `downgrade` takes back to `version`, which an
    /// older node runs on: refused while its lease runs, then migrated to
    /// the current version once it lapsed.
    func upgradedOnceOlderNodesStopped(from version: Int64, _ downgrade: (PostgresStore) throws -> Void) throws -> PostgresStore {
        do {
            let store = try PostgresStore(url: database.url)
            try downgrade(store)
            _ = try store.renewLease(node: "old-node", millis: 60_000)
        }
        XCTAssertThrowsError(try PostgresStore(url: database.url)) { e in
            XCTAssertTrue("\(e)".contains("running on this database at schema version \(version)"), "\(e)")
        }
        try PostgresConnection(url: database.url).execute("UPDATE herald_nodes SET lease_until = now() - interval '1 second'")
        let store = try PostgresStore(url: database.url)
        XCTAssertEqual(try store.db.query("SELECT max(version) FROM herald_schema").int64(0, 0), PostgresSchema.version)
        return store
    }

    /// Versions 4 to 9 only add what older nodes never use: they would
    /// roll while those run; version 10 (seen_state and the unseen counts,
    /// which older nodes' writes would leave behind) waits for them.
    func testAnUpgradeFromVersion3RollsWhileNodesRunUpToVersion10() throws {
        XCTAssertTrue(PostgresSchema.misreadByOlderNodes.isDisjoint(with: 4...9))
        XCTAssertTrue(PostgresSchema.misreadByOlderNodes.contains(10))
        let store = try upgradedOnceOlderNodesStopped(from: 3) { store in
            try downgradeToVersion4(store)
            try store.db.script("DROP FUNCTION herald_expect_heads; DELETE FROM herald_schema WHERE version >= 4")
        }
        _ = try store.upsert(alice, note("n_1"), previous: nil, at: t0)
        try store.begin()
        try store.claim([alice], lookups: [.id(alice, "n_1")])
        try store.commit()
    }

    /// Version 12 adds preferences, which an older node could not read in a
    /// feed: the upgrade from 11 waits for every node to stop; then they
    /// are saved and read as on a new database.
    func testMigrationFromVersion11AddsPreferencesOnceEveryNodeStopped() throws {
        XCTAssertTrue(PostgresSchema.misreadByOlderNodes.contains(12))
        let store = try upgradedOnceOlderNodesStopped(from: 11) { store in
            _ = try store.upsert(alice, note("n_0"), previous: nil, at: t0)
            try downgradeToVersion11(store)
        }
        XCTAssertEqual(try store.preferences(alice), .unsaved)
        let p = Preferences(groups: ["ads": Channels(inbox: false)], version: 1, updatedAt: t0)
        XCTAssertEqual(try store.savePreferences(alice, p, at: t0).seq, 2)
        XCTAssertEqual(try store.preferences(alice), p)
    }

    /// A database of version 2 keeps its rows' JSON; they read, change and
    /// prune as newer ones do.
    func testMigrationFromVersion2KeepsTheRowsJSON() throws {
        do {
            let store = try PostgresStore(url: database.url)
            for k in 0..<2 { _ = try store.upsert(alice, note("n_\(k)"), previous: nil, at: t0) }
            try downgradeToVersion2(store)
        }
        let store = try PostgresStore(url: database.url)
        XCTAssertEqual(try store.db.query("SELECT max(version) FROM herald_schema").int64(0, 0), PostgresSchema.version)
        XCTAssertEqual(try store.notification(alice, id: "n_0"), note("n_0"))
        var n1 = note("n_1")
        n1.readState = .read
        n1.version += 1
        _ = try store.upsert(alice, n1, previous: nil, at: t0 + 1)
        XCTAssertEqual(try store.pruneChanges(before: t0 + 10), 3)
        XCTAssertEqual(try store.history(alice, after: nil, limit: 10).sorted { $0.id < $1.id }, [note("n_0"), n1])
        XCTAssertEqual(try store.counts(alice).map(\.unread), [1])
    }

    /// Version 10 adds seenState: what a version 9 database holds counts as
    /// its readState implies (read ones seen, unread ones unseen), in the
    /// notifications, the counts and the changes a catch-up serves; writes
    /// after move the unseen counts.
    func testMigrationFromVersion9SeesTheReadAndNotTheUnread() throws {
        var read = note("n_1")
        read.readState = .read
        do {
            let store = try PostgresStore(url: database.url)
            var unreadButSeen = note("n_0")
            unreadButSeen.seenState = .seen  // version 9 had no such state
            _ = try store.upsert(alice, unreadButSeen, previous: nil, at: t0)
            _ = try store.upsert(alice, read, previous: nil, at: t0)
            var ios = note("n_2")
            ios.targetPlatforms = [.ios]
            _ = try store.upsert(alice, ios, previous: nil, at: t0)
            try downgradeToVersion9(store)
        }
        let store = try PostgresStore(url: database.url)
        XCTAssertEqual(try store.db.query("SELECT max(version) FROM herald_schema").int64(0, 0), PostgresSchema.version)
        XCTAssertEqual(try store.notification(alice, id: "n_0")?.seenState, .unseen)
        XCTAssertEqual(try store.notification(alice, id: "n_1")?.seenState, .seen)
        try assertCountsMatchHistory(store, alice)
        XCTAssertEqual(keyed(try store.counts(alice)).mapValues(\.unseen), ["*|*": 1, "ios|*": 1])
        for r in try store.changes(alice, after: 0, limit: 10) {
            guard case .upsert(let n) = r.change.op else { continue }
            let served = try JSONParser.parse(r.encoded).objectValue?["notification"]?.objectValue
            XCTAssertEqual(served?["seenState"]?.stringValue, n.readState == .read ? "seen" : "unseen", n.id)
            XCTAssertEqual(r.after?.unseen, n.readState == .unread)
        }
        var n0 = try XCTUnwrap(store.notification(alice, id: "n_0"))
        let was = n0
        n0.seenState = .seen
        n0.version += 1
        _ = try store.upsert(alice, n0, previous: was, at: t0 + 1)
        try assertCountsMatchHistory(store, alice)
        XCTAssertEqual(keyed(try store.counts(alice))["*|*"]?.unseen, 0)
        XCTAssertEqual(keyed(try store.counts(alice))["*|*"]?.unread, 1)
        _ = try store.delete(alice, try XCTUnwrap(store.notification(alice, id: "n_2")), reason: .deleted, at: t0 + 2)
        try assertCountsMatchHistory(store, alice)
    }

    func tap(_ cursor: Int64) -> PushMessage {
        PushMessage(kind: .tap, op: .state, cursor: cursor, epoch: "e", notificationId: nil, expiresAt: t0 + 86_400_000)
    }

    /// Version 9 keeps the outbox's length: a version 8 database's pushes
    /// are counted once by the migration (the older node stopped: version
    /// 10 waits for that).
    func testMigrationFromVersion8CountsTheOutboxOnce() throws {
        do {
            let store = try PostgresStore(url: database.url)
            for d in ["phone", "tablet", "watch"] { try store.enqueuePush(alice, deviceId: d, tap(1), at: t0, claimUntil: nil) }
            try downgradeToVersion8(store)
            try store.enqueuePush(alice, deviceId: "laptop", tap(1), at: t0, claimUntil: nil)
        }
        let store = try PostgresStore(url: database.url)
        XCTAssertEqual(try store.db.query("SELECT max(version) FROM herald_schema").int64(0, 0), PostgresSchema.version)
        XCTAssertEqual(try store.pendingPushes(), 4)
        try store.dropPushes(alice, deviceId: "phone")
        XCTAssertEqual(try store.pendingPushes(), 3)
    }

    /// An older node's push written but not committed when the migration
    /// starts is counted once: the migration waits for it.
    func testMigrationFromVersion8CountsAPushCommittingBesideIt() throws {
        let old = try PostgresStore(url: database.url)
        try old.enqueuePush(alice, deviceId: "phone", tap(1), at: t0, claimUntil: nil)
        try downgradeToVersion8(old)
        let pid = try old.db.query("SELECT pg_backend_pid()").int64(0, 0)
        try old.db.execute("BEGIN")
        try old.db.execute("""
            INSERT INTO push_outbox (app, user_id, device_id, kind, message, committed_at, due_at)
            SELECT app, user_id, 'tablet', kind, message, committed_at, due_at FROM push_outbox WHERE device_id = 'phone'
            """)
        let migrated = DispatchSemaphore(value: 0)
        let failure = Mutex<String?>(nil)
        let url = database.url
        Thread.detachNewThread {
            do { _ = try PostgresStore(url: url) } catch { failure.withLock { $0 = "\(error)" } }
            migrated.signal()
        }
        // The migration waits for the open insert (its lock), then goes on.
        let deadline = Date().addingTimeInterval(20)
        while try old.db.query("""
                SELECT count(*) FROM pg_locks l JOIN pg_locks h ON h.relation = l.relation AND h.granted
                WHERE NOT l.granted AND h.pid = $1
                """, [.int(pid)]).int64(0, 0) == 0 && Date() < deadline {
            Thread.sleep(forTimeInterval: 0.02)
        }
        try old.db.execute("COMMIT")
        XCTAssertEqual(migrated.wait(timeout: .now() + 30), .success)
        XCTAssertNil(failure.withLock { $0 })
        let store = try PostgresStore(url: database.url)
        XCTAssertEqual(try store.pendingPushes(), 2)
        try store.dropPushes(alice, deviceId: "tablet")
        try store.dropPushes(alice, deviceId: "phone")
        XCTAssertEqual(try store.pendingPushes(), 0, "no drift below the outbox")
    }

    /// Every session keeps its own row of the count, one outside Herald on
    /// another search_path too; a session that ended has its row folded
    /// into the rest, and the sum stays the outbox's length throughout.
    func testTheOutboxLengthIsKeptAcrossSessionsAndAnEndedOnesRowFolds() throws {
        let a = try PostgresStore(url: database.url)
        var ended: Int64 = 0
        do {
            let b = try PostgresStore(url: database.url)
            ended = try b.db.query("SELECT pg_backend_pid()").int64(0, 0)
            for d in ["phone", "tablet"] { try b.enqueuePush(alice, deviceId: d, tap(1), at: t0, claimUntil: nil) }
        }
        try a.enqueuePush(alice, deviceId: "watch", tap(1), at: t0, claimUntil: nil)
        // A session outside Herald, on another search_path.
        let outside = try PostgresConnection(url: try XCTUnwrap(ProcessInfo.processInfo.environment[PostgresTestDatabase.urlVariable]))
        try outside.execute("DELETE FROM \(database.schema).push_outbox WHERE device_id = 'phone'")
        let rows = { () throws -> Int64 in try a.db.query("SELECT count(*) FROM push_outbox_size").int64(0, 0) }
        // b's session is gone once the server says so.
        let deadline = Date().addingTimeInterval(20)
        while try a.db.query("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", [.int(ended)]).int64(0, 0) > 0
                && Date() < deadline {
            Thread.sleep(forTimeInterval: 0.02)
        }
        XCTAssertEqual(try rows(), 4, "the migration's row and one per session that wrote")
        XCTAssertEqual(try a.pendingPushes(), 2)
        XCTAssertEqual(try rows(), 3, "b's row was folded into row 0")
        XCTAssertEqual(try a.pendingPushes(), 2)
        XCTAssertEqual(try a.db.query("SELECT count(*) FROM push_outbox").int64(0, 0), 2)
    }

    // MARK: Readers

    func testReaderReadIsOneSnapshot() throws {
        let store = try PostgresStore(url: database.url)
        let reader = try XCTUnwrap(store.makeReader())
        _ = try store.upsert(alice, note("n_1"), previous: nil, at: t0)
        try reader.read { r throws(StoreError) in
            let before = try r.feed(alice)
            _ = try store.upsert(alice, note("n_2"), previous: nil, at: t0)
            XCTAssertEqual(try r.feed(alice), before, "a commit made during read is not seen")
            XCTAssertNil(try r.notification(alice, id: "n_2"))
        }
        XCTAssertEqual(try reader.feed(alice).head, 2)
    }

    /// A transaction that sent nothing reached nothing: its commit says so,
    /// so a store that is down is not reported working (/healthz).
    func testACommitOfNothingDoesNotReachTheServer() throws {
        let store = try PostgresStore(url: database.url)
        try store.begin()
        try store.commit()
        XCTAssertFalse(store.lastCommitReachedStore)
        try store.begin()
        _ = try store.upsert(alice, note("n_1"), previous: nil, at: t0)
        try store.commit()
        XCTAssertTrue(store.lastCommitReachedStore)
    }

    // MARK: Failures

    func testFailedStatementDoomsTheBatchUntilRolledBack() throws {
        let store = try PostgresStore(url: database.url)
        _ = try store.upsert(alice, note("n_1"), previous: nil, at: t0)
        try store.begin()
        _ = try store.upsert(alice, note("n_2"), previous: nil, at: t0)
        var clash = note("n_3")
        clash.appNotificationId = "a-n_1"  // unique per user: refused
        // Writes are pipelined: the refusal comes with the next read (or the commit).
        _ = try? store.upsert(alice, clash, previous: nil, at: t0)
        XCTAssertThrowsError(try store.feed(alice)) { e in XCTAssertTrue("\(e)".contains("23505"), "\(e)") }
        XCTAssertThrowsError(try store.feed(alice)) { e in XCTAssertTrue("\(e)".contains("roll back"), "\(e)") }
        XCTAssertThrowsError(try store.commit())
        store.rollback()
        XCTAssertNil(try store.notification(alice, id: "n_2"), "nothing of the batch committed")
        XCTAssertEqual(try store.feed(alice).head, 1)
    }

    func testLostConnectionFailsTheBatchAndTheNextOneReconnects() throws {
        let store = try PostgresStore(url: database.url)
        let admin = try PostgresStore(url: database.url)
        func cut() throws {
            let pid = try store.db.query("SELECT pg_backend_pid()").int64(0, 0)
            // Waits until the session is gone: its end is then in the socket.
            try admin.db.query("SELECT pg_terminate_backend($1::int, 10000)", [.int(pid)])
        }
        // Lost between batches: the next batch connects again first.
        try cut()
        try store.begin()
        _ = try store.upsert(alice, note("n_1"), previous: nil, at: t0)
        try store.commit()
        // Lost inside a batch: that batch fails, the next works.
        try store.begin()
        _ = try store.upsert(alice, note("n_2"), previous: nil, at: t0)
        try cut()
        _ = try? store.upsert(alice, note("n_3"), previous: nil, at: t0)  // pipelined: fails by the commit
        XCTAssertThrowsError(try store.commit()) { e in XCTAssertTrue(e is StoreError) }
        store.rollback()
        try store.begin()
        _ = try store.upsert(alice, note("n_4"), previous: nil, at: t0)
        try store.commit()
        XCTAssertEqual(try store.history(alice, after: nil, limit: 10).map(\.id).sorted(), ["n_1", "n_4"])
    }

    // MARK: Presence across nodes

    /// A node's records are seen by the others while its lease runs, a poll's
    /// only until its own end; a lapsed lease hides them, and once pruned the
    /// node is told to write them again.
    func testConnectionsBehindLeases() throws {
        let a = try PostgresStore(url: database.url), b = try PostgresStore(url: database.url)
        func seen(by store: PostgresStore, as node: String) throws -> [String] {
            try store.connections(alice, otherThan: node).map { "\($0.device) \($0.transport)" }.sorted()
        }
        XCTAssertFalse(try a.renewLease(node: "a", millis: 60_000), "a first lease")
        XCTAssertTrue(try a.renewLease(node: "a", millis: 60_000))
        try a.setConnection(node: "a", alice, device: "phone", transport: "websocket", millis: nil)
        try a.setConnection(node: "a", alice, device: "poller", transport: "poll", millis: 60_000)
        try a.setConnection(node: "a", alice, device: "gone", transport: "poll", millis: -1)
        XCTAssertEqual(try seen(by: b, as: "b"), ["phone websocket", "poller poll"])
        XCTAssertEqual(try seen(by: a, as: "a"), [], "a node's own records are its registry's business")
        try a.setConnection(node: "a", alice, device: "poller", transport: nil, millis: nil)
        XCTAssertEqual(try seen(by: b, as: "b"), ["phone websocket"])

        XCTAssertTrue(try a.renewLease(node: "a", millis: -1), "a lease that just ran out")
        XCTAssertEqual(try seen(by: b, as: "b"), [], "a dead node's devices are not connected")
        try b.pruneConnections(node: "b")
        XCTAssertTrue(try a.renewLease(node: "a", millis: -61_000), "not pruned within a minute of lapsing")
        try b.pruneConnections(node: "b")
        XCTAssertFalse(try a.renewLease(node: "a", millis: 60_000), "pruned: a must write its records again")
        XCTAssertEqual(try seen(by: b, as: "b"), [], "pruned with its records")

        try b.setConnection(node: "b", alice, device: "tablet", transport: "sse", millis: nil)
        _ = try b.renewLease(node: "b", millis: 60_000)
        XCTAssertEqual(try seen(by: a, as: "a"), ["tablet sse"])
        try b.retire(node: "b")
        XCTAssertEqual(try seen(by: a, as: "a"), [], "a stopping node's devices go at once")
    }

    /// The server stops: batches and reads fail with a StoreError; it comes
    /// back: the next ones work, nothing committed was lost.
    func testServerDownThenBack() throws {
        let store = try PostgresStore(url: database.url)
        let reader = try XCTUnwrap(store.makeReader())
        // Not used while the server is away: its first read after finds the
        // connection dead, and must make a new one rather than fail.
        let idle = try XCTUnwrap(store.makeReader())
        _ = try store.upsert(alice, note("n_1"), previous: nil, at: t0)
        _ = try idle.read { r throws(StoreError) in try r.feed(alice) }
        try PostgresTestDatabase.control("stop")
        var restarted = false
        defer { if !restarted { try? PostgresTestDatabase.control("start") } }
        for attempt in ["down", "still down"] {
            try store.begin()  // BEGIN is sent with the first statement
            XCTAssertThrowsError(try store.upsert(alice, note("n_x"), previous: nil, at: t0), attempt) { e in
                XCTAssertTrue(e is StoreError)
            }
            store.rollback()
        }
        XCTAssertThrowsError(try reader.feed(alice))
        try PostgresTestDatabase.control("start")
        restarted = true
        try store.begin()
        _ = try store.upsert(alice, note("n_2"), previous: nil, at: t0)
        try store.commit()
        XCTAssertEqual(try reader.feed(alice).head, 2)
        XCTAssertEqual(try reader.read { r throws(StoreError) in try r.history(alice, after: nil, limit: 10).count }, 2)
        XCTAssertEqual(try idle.read { r throws(StoreError) in try r.feed(alice).head }, 2)
    }

    // MARK: Push handles moving between users

    static let handle = PushHandle.fcm(token: "moving-token")

    /// Whether another session holds `user`'s feed lock (a `NOWAIT` lock
    /// from `probe`, rolled back at once).
    func isLocked(_ user: UserKey, probe: PostgresStore) throws -> Bool {
        try probe.db.execute("BEGIN")
        defer { _ = try? probe.db.script("ROLLBACK") }
        do {
            _ = try probe.db.query("SELECT head FROM feeds WHERE app = $1 AND user_id = $2 FOR UPDATE NOWAIT",
                                   [.text(user.app), .text(user.user)])
            return false
        } catch { return true }
    }

    /// A registration that takes another user's handle (`.pushHolder`)
    /// claims the holder with its own user, in the one order: blocked on
    /// the holder (u1), it holds nothing after it (u2, itself), so a batch
    /// holding u1 that then wants u2, in that same order, gets it rather
    /// than deadlocking (as it did when the holder was locked only once
    /// found, mid-batch, after u2).
    func testTakingAHandleClaimsItsHolderInTheSharedOrder() throws {
        let url = database.url
        let u1 = UserKey(app: "app1", user: "u1"), u2 = UserKey(app: "app1", user: "u2")
        let a = try PostgresStore(url: url), b = try PostgresStore(url: url), probe = try PostgresStore(url: url)
        try a.saveDevice(u1, Device(deviceId: "old", lastSeenAt: 1, push: Self.handle))
        try a.begin()
        try a.claim([u1, u2])  // their feed rows, for `isLocked`
        _ = try a.feed(u1)
        try a.commit()
        try b.begin()
        try b.claim([u1])
        _ = try b.feed(u1)
        let pid = try a.db.query("SELECT pg_backend_pid()").int64(0, 0)
        let done = DispatchSemaphore(value: 0)
        let failure = Mutex<String?>(nil)
        let mover = Unchecked(a)
        Thread.detachNewThread {
            let a = mover.value
            do {
                try a.begin()
                try a.claim([u2], lookups: [.pushHolder(u2, key: Self.handle.key)])
                let holder = try a.pushHolder(app: "app1", key: Self.handle.key)
                guard let holder else { throw StoreError("no holder") }
                let other = UserKey(app: "app1", user: holder.user)
                guard var d = try a.device(other, id: holder.deviceId) else { throw StoreError("no device") }
                d.push = nil
                try a.saveDevice(other, d)
                try a.saveDevice(u2, Device(deviceId: "new", lastSeenAt: 2, push: Self.handle))
                try a.commit()
            } catch { a.rollback(); failure.withLock { $0 = "\(error)" } }
            done.signal()
        }
        // Until a's claim waits for b's lock of u1 (an event, not a delay).
        let deadline = Date().addingTimeInterval(20)
        while try probe.db.query("SELECT count(*) FROM pg_locks WHERE pid = $1 AND NOT granted", [.int(pid)]).int64(0, 0) == 0 {
            guard Date() < deadline else { XCTFail("a never waited for u1"); break }
            Thread.sleep(forTimeInterval: 0.01)
        }
        XCTAssertFalse(try isLocked(u2, probe: probe), "waiting in its claim, a holds nothing after u1")
        try b.claim([u2])
        _ = try b.feed(u2)
        try b.commit()
        XCTAssertEqual(done.wait(timeout: .now() + 20), .success)
        XCTAssertNil(failure.withLock { $0 })
        XCTAssertTrue(try probe.pushHolder(app: "app1", key: Self.handle.key)! == (user: "u2", deviceId: "new"))
        XCTAssertNil(try probe.device(u1, id: "old")?.push)
    }

    /// A holder that took the handle after the claim read it is locked
    /// without waiting: taken by another transaction, a conflict (the
    /// engine runs the batch again, and its claim finds the new holder);
    /// free, locked then and there.
    func testAHolderFoundAfterTheClaimIsLockedWithoutWaiting() throws {
        let url = database.url
        let u2 = UserKey(app: "app1", user: "u2"), u3 = UserKey(app: "app1", user: "u3")
        let a = try PostgresStore(url: url), b = try PostgresStore(url: url), probe = try PostgresStore(url: url)
        try a.begin()
        try a.claim([u2], lookups: [.pushHolder(u2, key: Self.handle.key)])  // no holder yet
        try b.begin()
        try b.claim([u3])
        try b.saveDevice(u3, Device(deviceId: "tab", lastSeenAt: 1, push: Self.handle))
        try b.commit()
        try b.begin()
        try b.claim([u3])
        _ = try b.feed(u3)
        XCTAssertThrowsError(try a.pushHolder(app: "app1", key: Self.handle.key)) { e in
            XCTAssertEqual((e as? StoreError)?.conflict, true, "\(e)")
        }
        a.rollback()
        b.rollback()
        // Run again: the claim finds u3 and locks it with u2.
        try a.begin()
        try a.claim([u2], lookups: [.pushHolder(u2, key: Self.handle.key)])
        XCTAssertTrue(try isLocked(u3, probe: probe), "claimed with the registering user")
        XCTAssertTrue(try a.pushHolder(app: "app1", key: Self.handle.key)! == (user: "u3", deviceId: "tab"))
        a.rollback()
        // Not claimed but free: locked at once.
        try a.begin()
        try a.claim([u2])
        XCTAssertFalse(try isLocked(u3, probe: probe))
        XCTAssertTrue(try a.pushHolder(app: "app1", key: Self.handle.key)! == (user: "u3", deviceId: "tab"))
        XCTAssertTrue(try isLocked(u3, probe: probe), "the holder is the transaction's to write")
        a.rollback()
    }
}

/// Hands a value to another thread that alone uses it from then on.
struct Unchecked<T>: @unchecked Sendable {  // one thread at a time, by the callers' contract
    let value: T
    init(_ v: T) { value = v }
}

/// Values several test threads add to.
final class Collected<T>: @unchecked Sendable {  // every access is under `lock`
    private let lock = NSLock()
    private var items: [T] = []
    func add(_ v: T) { lock.withLock { items.append(v) } }
    func add(contentsOf vs: [T]) { lock.withLock { items += vs } }
    var values: [T] { lock.withLock { items } }
}
