import Foundation
import XCTest
import HeraldCore
import HeraldTestSupport
@testable import HeraldStores

/// What only a durable store can promise: restarts, schema versions, files
/// that are not ours, locking and full disks.
final class SQLiteStoreTests: XCTestCase {
    var dir: URL!
    var path: String { dir.appendingPathComponent("herald.db").path }

    let alice = UserKey(app: "app1", user: "alice")
    let t0: Millis = 1_800_000_000_000

    override func setUpWithError() throws {
        dir = FileManager.default.temporaryDirectory.appendingPathComponent("herald-sqlite-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
    }

    override func tearDown() {
        if let dir { try? FileManager.default.removeItem(at: dir) }
        super.tearDown()
    }

    func note(_ id: String, _ anid: String, payload: JSONObject = ["title": "hi"]) -> Notification {
        Notification(id: id, appNotificationId: anid, userId: alice.user, payload: payload,
                     targetPlatforms: [.web], targetTags: try? TagExpression.parse("a || b"),
                     createdAt: t0, updatedAt: t0, expiresAt: t0 + 86_400_000)
    }

    func bytes(_ p: String) throws -> Data { try Data(contentsOf: URL(fileURLWithPath: p)) }

    func assertRefused(_ p: String, containing text: String, file: StaticString = #filePath, line: UInt = #line) {
        do {
            _ = try SQLiteStore(path: p)
            XCTFail("opened \(p)", file: file, line: line)
        } catch {
            XCTAssertTrue(error.description.contains(text), "\(error)", file: file, line: line)
        }
    }

    // MARK: Restarts

    func testReopenKeepsDataSeqAndEpoch() throws {
        var store: SQLiteStore? = try SQLiteStore(path: path)
        let bob = UserKey(app: "app1", user: "bob")
        let epoch = try XCTUnwrap(store?.epoch)
        XCTAssertTrue(epoch.hasPrefix("s-"))
        let n1 = note("n_1", "a1"), n2 = note("n_2", "a2")
        try store!.begin()
        _ = try store!.upsert(alice, n1, previous: nil, at: t0)
        _ = try store!.upsert(alice, n2, previous: nil, at: t0)
        try store!.commit()
        _ = try store!.delete(alice, n1, reason: .deleted, at: t0 + 1)
        try store!.saveDevice(alice, Device(deviceId: "d1", platform: .ios, tags: ["x"], lastSeenAt: 5, viewGeneration: 2))
        let phone = Device(deviceId: "phone", lastSeenAt: 5, push: .fcm(token: "fcm-token"))
        try store!.saveDevice(bob, phone)
        let before = try store!.changes(alice, after: 0, limit: 10)
        let head = try store!.feed(alice).head
        store = nil // closes

        let again = try SQLiteStore(path: path)
        XCTAssertEqual(again.epoch, epoch, "the epoch lives as long as the file")
        XCTAssertEqual(try again.feed(alice), FeedState(head: head, floor: 0))
        XCTAssertNil(try again.notification(alice, id: "n_1"))
        XCTAssertEqual(try again.notification(alice, appNotificationId: "a2"), n2)
        XCTAssertEqual(try again.changes(alice, after: 0, limit: 10).map(\.encoded), before.map(\.encoded))
        XCTAssertEqual(try again.changes(alice, after: 0, limit: 10).map(\.after), before.map(\.after))
        XCTAssertEqual(try again.devices(alice), [Device(deviceId: "d1", platform: .ios, tags: ["x"], lastSeenAt: 5, viewGeneration: 2)])
        XCTAssertEqual(try again.pushDevices(of: [alice, bob]), [bob: [phone]], "who holds a handle is read again at open")
        let next = try again.upsert(alice, note("n_3", "a3"), previous: nil, at: t0 + 2)
        XCTAssertGreaterThan(next.seq, head, "seq continues, never reused")
        XCTAssertEqual(try again.db.int("PRAGMA user_version"), SQLiteStore.schemaVersion)

        // A second file gets its own epoch.
        let other = try SQLiteStore(path: dir.appendingPathComponent("other.db").path)
        XCTAssertNotEqual(other.epoch, epoch)
    }

    /// A copy of the files taken while the store is open, after a commit and
    /// before any checkpoint, is what a `kill -9` leaves behind.
    func testCommittedDataSurvivesInTheWALWithoutCheckpoint() throws {
        let store = try SQLiteStore(path: path)
        try store.begin()
        let r = try store.upsert(alice, note("n_1", "a1"), previous: nil, at: t0)
        try store.commit()
        try store.begin()
        _ = try store.upsert(alice, note("n_2", "a2"), previous: nil, at: t0) // not committed
        let crash = dir.appendingPathComponent("crash.db").path
        for suffix in ["", "-wal"] {
            try FileManager.default.copyItem(atPath: path + suffix, toPath: crash + suffix)
        }
        store.rollback()

        let reopened = try SQLiteStore(path: crash)
        XCTAssertEqual(reopened.epoch, store.epoch)
        XCTAssertEqual(try reopened.feed(alice).head, r.seq)
        XCTAssertEqual(try reopened.notification(alice, id: "n_1"), note("n_1", "a1"))
        XCTAssertNil(try reopened.notification(alice, id: "n_2"), "uncommitted work is not there")
    }

    func testDurabilitySettings() throws {
        for (d, expected) in [(SQLiteStore.Durability.full, 2), (.normal, 1), (.off, 0)] {
            let s = try SQLiteStore(path: dir.appendingPathComponent("\(d.rawValue).db").path, durability: d)
            XCTAssertEqual(try s.db.int("PRAGMA synchronous"), Int64(expected))
            XCTAssertEqual(try s.db.text("PRAGMA journal_mode"), "wal")
            XCTAssertEqual(s.durability, d)
        }
    }

    // MARK: Files that are not ours

    /// With `deferredSync` a commit writes the log without syncing it, and
    /// `commitSync` (the engine's sync thread) syncs it; only at full
    /// durability and on a file.
    func testDeferredSyncLeavesTheLogsSyncToCommitSync() throws {
        // Through a symlink: SQLite keeps its log beside the real file, and
        // that is the file to sync.
        let real = dir.appendingPathComponent("real")
        try FileManager.default.createDirectory(at: real, withIntermediateDirectories: true)
        try FileManager.default.createSymbolicLink(atPath: path, withDestinationPath: real.appendingPathComponent("herald.db").path)
        let s = try SQLiteStore(path: path, deferredSync: true)
        XCTAssertEqual(try s.db.int("PRAGMA synchronous"), 1, "NORMAL: the commit does not sync the log")
        let sync = try XCTUnwrap(s.commitSync as? SQLiteLogSync)
        XCTAssertEqual(sync.path, real.appendingPathComponent("herald.db-wal").path)
        XCTAssertTrue(FileManager.default.fileExists(atPath: sync.path))
        try sync.sync() // before any write too
        try s.begin()
        _ = try s.upsert(alice, note("n_1", "a1"), previous: nil, at: t0)
        try s.commit()
        try sync.sync()
        XCTAssertEqual(try s.notification(alice, id: "n_1"), note("n_1", "a1"))

        XCTAssertNil(try SQLiteStore(path: dir.appendingPathComponent("inline.db").path).commitSync)
        let normal = try SQLiteStore(path: dir.appendingPathComponent("normal.db").path, durability: .normal, deferredSync: true)
        XCTAssertNil(normal.commitSync)
        XCTAssertEqual(try normal.db.int("PRAGMA synchronous"), 1)
        XCTAssertNil(try SQLiteStore(path: ":memory:", deferredSync: true).commitSync)
    }

    func testNewerSchemaIsRefusedAndNotModified() throws {
        do {
            let s = try SQLiteStore(path: path)
            _ = try s.upsert(alice, note("n_1", "a1"), previous: nil, at: t0)
            try s.db.execute("PRAGMA user_version = \(SQLiteStore.schemaVersion + 7)")
            s.close()
        }
        let original = try bytes(path)
        assertRefused(path, containing: "newer")
        XCTAssertEqual(try bytes(path), original, "the file is untouched")
        let wal = path + "-wal"
        let walBytes = FileManager.default.fileExists(atPath: wal) ? try bytes(wal) : Data()
        XCTAssertTrue(walBytes.isEmpty, "nothing left to replay")
    }

    func testGarbageFileIsRefused() throws {
        var junk = Data("this is not a database, just some text that goes on and on. ".utf8)
        while junk.count < 16384 { junk.append(junk) }
        try junk.write(to: URL(fileURLWithPath: path))
        assertRefused(path, containing: "not a database")
        XCTAssertEqual(try bytes(path), junk)
    }

    func testForeignSQLiteDatabaseIsRefused() throws {
        do {
            let raw = try SQLiteDatabase(path: path)
            try raw.script("CREATE TABLE accounts (id INTEGER PRIMARY KEY, name TEXT); INSERT INTO accounts (name) VALUES ('x');")
            raw.close()
        }
        let original = try bytes(path)
        assertRefused(path, containing: "not a Herald")
        XCTAssertEqual(try bytes(path), original)
    }

    func testUnopenablePathIsAStoreError() {
        assertRefused(dir.appendingPathComponent("no/such/dir/herald.db").path, containing: "cannot open")
    }

    func testForwardMigrationFromVersion1() throws {
        do {
            let s = try SQLiteStore(path: path)
            _ = try s.upsert(alice, note("n_1", "a1"), previous: nil, at: t0)
            try s.saveDevice(alice, Device(deviceId: "d1", lastSeenAt: 9))
            // Turn it into what version 1 wrote.
            try downgradeToVersion4(s)
            try s.db.script("""
                DROP TABLE counts; ALTER TABLE devices DROP COLUMN view_generation;
                ALTER TABLE feeds DROP COLUMN unread; ALTER TABLE feeds DROP COLUMN no_interaction;
                ALTER TABLE feeds DROP COLUMN total; PRAGMA user_version = 1;
                """)
            s.close()
        }
        let s = try SQLiteStore(path: path)
        XCTAssertEqual(try s.db.int("PRAGMA user_version"), SQLiteStore.schemaVersion)
        XCTAssertEqual(try s.db.text("SELECT value FROM meta WHERE key = 'schema_version'"), String(SQLiteStore.schemaVersion))
        XCTAssertEqual(try s.devices(alice), [Device(deviceId: "d1", lastSeenAt: 9, viewGeneration: 0)])
        XCTAssertEqual(try s.notification(alice, id: "n_1")?.id, "n_1")
        try s.saveDevice(alice, Device(deviceId: "d1", lastSeenAt: 10, viewGeneration: 1))
        XCTAssertEqual(try s.devices(alice).first?.viewGeneration, 1)
        try assertCountsMatchHistory(s, alice)
    }

    /// Turns a file of this version into what version 4 wrote: each
    /// notification's JSON in its row, no targeting columns, changes that do
    /// not name their notification.
    func downgradeToVersion4(_ s: SQLiteStore) throws {
        try downgradeToVersion10(s)
        try s.db.script("""
            DROP INDEX devices_with_push; DROP TABLE push_outbox_size; DROP TABLE shared_tokens; DROP TABLE push_tap_spacing; DROP TABLE push_outbox; DROP INDEX devices_by_push_key;
            ALTER TABLE devices DROP COLUMN push; ALTER TABLE devices DROP COLUMN push_key;
            """)
        let prefix = #"length('{"seq":' || c.seq || ',"op":"upsert","notification":')"#
        try s.db.script("""
            UPDATE notifications SET json = (SELECT substr(c.change, \(prefix) + 1, length(c.change) - \(prefix) - 1)
                                             FROM changes c WHERE c.app = notifications.app AND c.user = notifications.user
                                                              AND c.seq = notifications.seq)
                WHERE seq IS NOT NULL;
            ALTER TABLE notifications DROP COLUMN seq; ALTER TABLE notifications DROP COLUMN target_platforms;
            ALTER TABLE notifications DROP COLUMN target_tags; ALTER TABLE changes DROP COLUMN notification_id;
            PRAGMA user_version = 4;
            """)
    }

    /// Turns a file of this version into what version 14 wrote: history's own index.
    func downgradeToVersion14(_ s: SQLiteStore) throws {
        try s.db.script("""
            CREATE INDEX notifications_history ON notifications (app, user, created_at DESC, id DESC);
            PRAGMA user_version = 14;
            """)
    }

    /// Version 15 drops history's index: history written by version 14
    /// reads back in the same order, in pages too, from the index by id.
    func testMigrationFromVersion14KeepsHistoryOrder() throws {
        let times = [t0, t0 + 5, t0, t0 - 3, t0 + 5, t0 + 1, t0]
        let ns = times.enumerated().map { k, at in
            Notification(id: NotificationID.make(now: at), appNotificationId: "a\(k)", userId: alice.user, payload: ["k": .int(Int64(k))],
                         createdAt: at, updatedAt: at, expiresAt: at + 86_400_000)
        }
        let expected = ns.sorted { HistoryKey($0) < HistoryKey($1) }
        do {
            let s = try SQLiteStore(path: path)
            try downgradeToVersion14(s)
            for n in ns.shuffled() { _ = try s.upsert(alice, n, previous: nil, at: t0) }
            XCTAssertEqual(try s.history(alice, after: nil, limit: 50), expected, "version 14's order")
            s.close()
        }
        let s = try SQLiteStore(path: path)
        XCTAssertEqual(try s.db.int("PRAGMA user_version"), SQLiteStore.schemaVersion)
        XCTAssertEqual(try s.db.int("SELECT count(*) FROM sqlite_master WHERE name = 'notifications_history'"), 0)
        XCTAssertEqual(try s.history(alice, after: nil, limit: 50), expected)
        var got: [Notification] = []
        var after: HistoryKey? = nil
        while true {
            let page = try s.history(alice, after: after, limit: 3)
            got += page
            guard let last = page.last else { break }
            after = HistoryKey(last)
        }
        XCTAssertEqual(got, expected)
    }

    /// Turns a file of this version into what version 13 wrote: no webhook outbox.
    func downgradeToVersion13(_ s: SQLiteStore) throws {
        try downgradeToVersion14(s)
        try s.db.script("DROP TABLE webhook_outbox; DROP TABLE webhook_outbox_size; PRAGMA user_version = 13")
    }

    /// Version 14 adds the webhook outbox: empty, counted from 0, kept by what writes it.
    func testMigrationFromVersion13StartsAnEmptyCountedWebhookOutbox() throws {
        do {
            let s = try SQLiteStore(path: path)
            try downgradeToVersion13(s)
            s.close()
        }
        let s = try SQLiteStore(path: path)
        XCTAssertEqual(try s.db.int("PRAGMA user_version"), SQLiteStore.schemaVersion)
        XCTAssertEqual(try s.pendingWebhooks(), 0)
        try s.begin()
        try s.enqueueWebhook(app: "a", url: "http://h", eventId: "msg_1", body: Array("{}".utf8), at: t0)
        try s.commit()
        XCTAssertEqual(try s.pendingWebhooks(), 1)
    }

    /// Turns a file of this version into what version 12 wrote: no
    /// preferences (and no save of them in a feed).
    func downgradeToVersion12(_ s: SQLiteStore) throws {
        try downgradeToVersion13(s)
        try s.db.script("""
            DROP TABLE preferences; DELETE FROM changes WHERE json_extract(change, '$.op') = 'preferences';
            PRAGMA user_version = 12;
            """)
    }

    /// Turns a file of this version into what version 11 wrote: no
    /// `snoozedUntil`, no wake index.
    func downgradeToVersion11(_ s: SQLiteStore) throws {
        try downgradeToVersion12(s)
        try s.db.script(withoutSnoozedUntilInTheStoredJSON + """
            DROP INDEX notifications_wake; ALTER TABLE notifications DROP COLUMN snoozed_until;
            PRAGMA user_version = 11;
            """)
        XCTAssertEqual(try s.db.int("SELECT count(*) FROM changes WHERE instr(change, 'snoozedUntil') > 0"), 0)
    }

    /// Turns a file of this version into what version 10 wrote: no
    /// `seenState` in the stored JSON, no seen_state or unseen columns.
    func downgradeToVersion10(_ s: SQLiteStore) throws {
        try downgradeToVersion11(s)
        try s.db.script(withoutSeenStateInTheStoredJSON + """
            ALTER TABLE notifications DROP COLUMN seen_state; ALTER TABLE feeds DROP COLUMN unseen;
            ALTER TABLE counts DROP COLUMN unseen;
            ALTER TABLE changes DROP COLUMN before_unseen; ALTER TABLE changes DROP COLUMN after_unseen;
            PRAGMA user_version = 10;
            """)
        XCTAssertEqual(try s.db.int("SELECT count(*) FROM changes WHERE instr(change, 'seenState') > 0"), 0)
    }

    /// Version 13 adds preferences: a file of version 12 keeps its feed,
    /// and saves and reads them after.
    func testMigrationFromVersion12AddsPreferences() throws {
        do {
            let s = try SQLiteStore(path: path)
            _ = try s.upsert(alice, note("n_1", "a1"), previous: nil, at: t0)
            try downgradeToVersion12(s)
            s.close()
        }
        let s = try SQLiteStore(path: path)
        XCTAssertEqual(try s.db.int("PRAGMA user_version"), SQLiteStore.schemaVersion)
        XCTAssertEqual(try s.preferences(alice), .unsaved)
        let p = Preferences(default: Channels(push: false), version: 1, updatedAt: t0)
        XCTAssertEqual(try s.savePreferences(alice, p, at: t0).seq, 2)
        XCTAssertEqual(try s.preferences(alice), p)
        XCTAssertEqual(try s.notification(alice, id: "n_1")?.id, "n_1")
    }

    // MARK: Counts

    func targeted(_ id: String, user: UserKey, _ platforms: [Platform]?, _ tags: String?,
                  read: ReadState = .unread, action: UserActionState = .noInteraction) -> Notification {
        Notification(id: id, appNotificationId: "a-" + id, userId: user.user, payload: ["id": .string(id)],
                     targetPlatforms: platforms, targetTags: tags.flatMap { try? TagExpression.parse($0) },
                     createdAt: t0, updatedAt: t0, expiresAt: t0 + 86_400_000, readState: read, userActionState: action)
    }

    /// Notifications of three users, some whose platforms differ only in
    /// order or repeats (one targeting), in every state.
    var mixed: [(UserKey, Notification)] {
        let bob = UserKey(app: "app1", user: "bob"), other = UserKey(app: "app2", user: "alice")
        return [
            (alice, targeted("n_1", user: alice, nil, nil)),
            (alice, targeted("n_2", user: alice, nil, nil, read: .read)),
            (alice, targeted("n_3", user: alice, [.ios, .web], nil, action: .dismissed)),
            (alice, targeted("n_4", user: alice, [.web, .ios, .web], nil, read: .read, action: .snoozed)),
            (alice, targeted("n_5", user: alice, [.web], "a || b")),
            (alice, targeted("n_6", user: alice, nil, "a || b", read: .read, action: .activated)),
            (alice, targeted("n_7", user: alice, [], nil)),
            (bob, targeted("n_8", user: bob, [.android], "!muted")),
            (bob, targeted("n_9", user: bob, nil, nil, read: .read)),
            (other, targeted("n_10", user: other, [.windows, .other], nil)),
        ]
    }

    func testCountsSurviveReopen() throws {
        let users = Set(mixed.map(\.0))
        var before: [UserKey: [String: TargetingCounts]] = [:]
        do {
            let s = try SQLiteStore(path: path)
            for (u, n) in mixed { _ = try s.upsert(u, n, previous: nil, at: t0) }
            for u in users {
                try assertCountsMatchHistory(s, u)
                before[u] = keyed(try s.counts(u))
            }
            XCTAssertEqual(before[alice]?.count, 5)
            s.close()
        }
        let s = try SQLiteStore(path: path)
        for u in users { XCTAssertEqual(keyed(try s.counts(u)), before[u]) }
    }

    func testMigrationFromVersion2BackfillsCounts() throws {
        do {
            let raw = try SQLiteDatabase(path: path)
            try SQLiteStore.migrate(raw, path: path, to: 2)
            for (u, n) in mixed {
                try raw.execute("""
                    INSERT INTO notifications (app, user, id, app_notification_id, created_at, expires_at,
                                               read_state, user_action_state, version, targeted, json)
                    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                    """, [.text(u.app), .text(u.user), .text(n.id), .text(n.appNotificationId), .int(n.createdAt),
                          .int(n.expiresAt), .text(n.readState.rawValue), .text(n.userActionState.rawValue), .int(n.version),
                          .int(n.targetPlatforms == nil && n.targetTags == nil ? 0 : 1), .utf8(n.json.encoded[...])])
            }
            XCTAssertEqual(try raw.int("PRAGMA user_version"), 2)
            XCTAssertNil(try raw.int("SELECT count(*) FROM sqlite_master WHERE name = 'counts'").flatMap { $0 == 0 ? nil : $0 })
            raw.close()
        }
        let s = try SQLiteStore(path: path)
        XCTAssertEqual(try s.db.int("PRAGMA user_version"), SQLiteStore.schemaVersion)
        for u in Set(mixed.map(\.0)) {
            XCTAssertEqual(keyed(try s.counts(u)), scannedCounts(mixed.filter { $0.0 == u }.map(\.1)), "\(u)")
        }
        // Writes after the migration move the backfilled rows.
        var n4 = try XCTUnwrap(s.notification(alice, id: "n_4"))
        n4.readState = .unread
        n4.version += 1
        _ = try s.upsert(alice, n4, previous: nil, at: t0)
        _ = try s.delete(alice, try XCTUnwrap(s.notification(alice, id: "n_3")), reason: .deleted, at: t0)
        _ = try s.delete(alice, try XCTUnwrap(s.notification(alice, id: "n_7")), reason: .deleted, at: t0)
        try assertCountsMatchHistory(s, alice)
        XCTAssertEqual(keyed(try s.counts(alice))["web,ios|*"], TargetingCounts(targeting: Targeting(platforms: [.web, .ios], tags: nil), unread: 1, noInteraction: 0, total: 1))
    }

    /// Version 4 keeps the counts of notifications for everyone in the feed
    /// row: a version 3 file moves them there and keeps its feeds' heads.
    func testMigrationFromVersion3MovesCountsIntoTheFeedRow() throws {
        var before: [UserKey: [String: TargetingCounts]] = [:]
        let users = Set(mixed.map(\.0))
        do {
            let s = try SQLiteStore(path: path)
            for (u, n) in mixed { _ = try s.upsert(u, n, previous: nil, at: t0) }
            for u in users { before[u] = keyed(try s.counts(u)) }
            // Turn it into what version 3 wrote.
            try downgradeToVersion4(s)
            try s.db.script("""
                INSERT INTO counts (app, user, platforms, tags, unread, no_interaction, total)
                    SELECT app, user, '*', '', unread, no_interaction, total FROM feeds WHERE total > 0;
                ALTER TABLE feeds DROP COLUMN unread; ALTER TABLE feeds DROP COLUMN no_interaction;
                ALTER TABLE feeds DROP COLUMN total; PRAGMA user_version = 3;
                DELETE FROM feeds WHERE user = 'bob';  -- counts without a feed row (as the v2 backfill left)
                """)
            s.close()
        }
        let s = try SQLiteStore(path: path)
        XCTAssertEqual(try s.db.int("PRAGMA user_version"), SQLiteStore.schemaVersion)
        XCTAssertEqual(try s.db.int("SELECT count(*) FROM counts WHERE platforms = '*' AND tags = ''"), 0)
        XCTAssertEqual(try s.feed(UserKey(app: "app1", user: "bob")).head, 0)
        for u in users { XCTAssertEqual(keyed(try s.counts(u)), before[u], "\(u)") }
        XCTAssertEqual(try s.feed(alice).head, 7)
        let r = try s.upsert(alice, targeted("n_9", user: alice, nil, nil), previous: nil, at: t0)
        XCTAssertEqual(r.seq, 8)
        _ = try s.delete(alice, try XCTUnwrap(s.notification(alice, id: "n_1")), reason: .deleted, at: t0)
        try assertCountsMatchHistory(s, alice)
    }

    /// Version 9 keeps the outbox's length beside it: a version 8 file's
    /// pushes are counted once by the migration, and every write moves it.
    func testMigrationFromVersion8CountsTheOutboxOnce() throws {
        let tap = PushMessage(kind: .tap, op: .state, cursor: 1, epoch: "e", notificationId: nil, expiresAt: t0 + 86_400_000)
        do {
            let raw = try SQLiteDatabase(path: path)
            try SQLiteStore.migrate(raw, path: path, to: 8)
            for d in ["phone", "tablet", "watch"] {
                try raw.execute("""
                    INSERT INTO push_outbox (app, user, device_id, kind, message, committed_at, due_at) VALUES (?, ?, ?, 'tap', ?, ?, ?)
                    """, [.text(alice.app), .text(alice.user), .text(d), .utf8(tap.json.encoded[...]), .int(t0), .int(t0)])
            }
            raw.close()
        }
        let s = try SQLiteStore(path: path)
        XCTAssertEqual(try s.db.int("PRAGMA user_version"), SQLiteStore.schemaVersion)
        XCTAssertEqual(try s.pendingPushes(), 3)
        try s.dropPushes(alice, deviceId: "phone")
        try s.enqueuePush(alice, deviceId: "tablet", tap, at: t0 + 1, claimUntil: nil)
        XCTAssertEqual(try s.pendingPushes(), 2, "a tap joined to the one waiting adds no row")
        XCTAssertEqual(try s.db.int("SELECT count(*) FROM push_outbox"), 2)
    }

    /// Version 10 finds push holders in an index: the registrations a
    /// version 9 file holds are in it, and so is each one saved after.
    func testMigrationFromVersion9FindsTheHoldersRegisteredBefore() throws {
        let bob = UserKey(app: alice.app, user: "bob"), carol = UserKey(app: alice.app, user: "carol")
        func phone(_ token: String) -> Device {
            Device(deviceId: "phone", platform: .ios, lastSeenAt: t0,
                   push: .apns(token: String(repeating: token, count: 32), environment: .production))
        }
        do {
            let s = try SQLiteStore(path: path)
            try s.saveDevice(alice, phone("0a"))
            try s.saveDevice(bob, Device(deviceId: "tablet", lastSeenAt: t0))
            try downgradeToVersion10(s)
            try s.db.script("DROP INDEX devices_with_push; PRAGMA user_version = 9")
            s.close()
        }
        let s = try SQLiteStore(path: path)
        XCTAssertEqual(try s.db.int("PRAGMA user_version"), SQLiteStore.schemaVersion)
        XCTAssertEqual(try s.pushDevices(of: [alice, bob, carol]), [alice: [phone("0a")]])
        try s.saveDevice(carol, phone("0b"))
        var cleared = phone("0a")
        cleared.push = nil
        try s.saveDevice(alice, cleared)
        XCTAssertEqual(try s.pushDevices(of: [alice, bob, carol]), [carol: [phone("0b")]], "a handle removed leaves the index")
    }

    /// Version 11 adds seenState: what a version 10 file holds counts as its
    /// readState implies (read ones seen, unread ones unseen), in the
    /// notifications, their counts and the changes a catch-up serves, and
    /// writes after the migration move the unseen counts.
    func testMigrationFromVersion10SeesTheReadAndNotTheUnread() throws {
        let users = Set(mixed.map(\.0))
        var unreadBefore: [UserKey: [String: TargetingCounts]] = [:]
        do {
            let s = try SQLiteStore(path: path)
            for (u, n) in mixed {
                var seen = n
                seen.seenState = .seen  // seen in this version; version 10 had no such state
                _ = try s.upsert(u, seen, previous: nil, at: t0)
            }
            for u in users { unreadBefore[u] = keyed(try s.counts(u)) }
            try downgradeToVersion10(s)
            s.close()
        }
        let s = try SQLiteStore(path: path)
        XCTAssertEqual(try s.db.int("PRAGMA user_version"), SQLiteStore.schemaVersion)
        for (u, n) in mixed {
            let back = try XCTUnwrap(s.notification(u, id: n.id))
            XCTAssertEqual(back.seenState, n.readState == .read ? .seen : .unseen, n.id)
        }
        for u in users {
            try assertCountsMatchHistory(s, u)
            let counts = keyed(try s.counts(u))
            for (k, c) in counts {
                XCTAssertEqual(c.unseen, c.unread, "\(u) \(k): unseen starts as unread")
                XCTAssertEqual(c.unread, unreadBefore[u]?[k]?.unread, "\(u) \(k)")
            }
        }
        // The changes recorded before carry seenState as served, and their
        // presences count unseen as unread.
        for r in try s.changes(alice, after: 0, limit: 100) {
            guard case .upsert(let n) = r.change.op else { continue }
            let served = try JSONParser.parse(r.encoded).objectValue?["notification"]?.objectValue
            XCTAssertEqual(served?["seenState"]?.stringValue, n.readState == .read ? "seen" : "unseen", n.id)
            XCTAssertEqual(r.after?.unseen, n.readState == .unread, n.id)
            XCTAssertEqual(Change(json: try JSONParser.parse(r.encoded))?.seq, r.seq)
        }
        // Seeing an unread one moves unseen alone; deleting moves both.
        var n1 = try XCTUnwrap(s.notification(alice, id: "n_1"))
        let was = n1
        n1.seenState = .seen
        n1.version += 1
        let r = try s.upsert(alice, n1, previous: was, at: t0 + 1)
        XCTAssertEqual(r.badgeDelta(for: .unnamed), Badge(unread: 0, unseen: -1))
        try assertCountsMatchHistory(s, alice)
        XCTAssertEqual(keyed(try s.counts(alice))["*|*"]?.unseen, 0)
        XCTAssertEqual(keyed(try s.counts(alice))["*|*"]?.unread, 1)
        _ = try s.delete(alice, try XCTUnwrap(s.notification(alice, id: "n_5")), reason: .deleted, at: t0 + 2)
        try assertCountsMatchHistory(s, alice)
        s.close()
        let again = try SQLiteStore(path: path)
        try assertCountsMatchHistory(again, alice)
        XCTAssertEqual(try again.notification(alice, id: "n_1")?.seenState, .seen)
    }

    /// Version 5 keeps a notification's JSON only in its change: a version
    /// 4 file keeps its rows' JSON, gets their targeting in columns, and
    /// reads, counts, writes and prunes old and new rows alike.
    func testMigrationFromVersion4KeepsTheRowsJSON() throws {
        let users = Set(mixed.map(\.0))
        var before: [UserKey: [String: TargetingCounts]] = [:]
        var stored: [String: Notification] = [:]
        do {
            let s = try SQLiteStore(path: path)
            for (u, n) in mixed {
                _ = try s.upsert(u, n, previous: nil, at: t0)
                stored[n.id] = try s.notification(u, id: n.id)
            }
            for u in users { before[u] = keyed(try s.counts(u)) }
            try downgradeToVersion4(s)
            XCTAssertEqual(try s.db.int("SELECT count(*) FROM notifications WHERE json = ''"), 0)
            s.close()
        }
        let s = try SQLiteStore(path: path)
        XCTAssertEqual(try s.db.int("PRAGMA user_version"), SQLiteStore.schemaVersion)
        for (u, n) in mixed { XCTAssertEqual(try s.notification(u, id: n.id), stored[n.id]) }
        for u in users { XCTAssertEqual(keyed(try s.counts(u)), before[u], "\(u)") }
        // Changing and deleting the old rows moves the counts by their targeting.
        var n5 = try XCTUnwrap(s.notification(alice, id: "n_5"))
        n5.readState = .read
        n5.version += 1
        _ = try s.upsert(alice, n5, previous: nil, at: t0 + 1)
        _ = try s.delete(alice, try XCTUnwrap(s.notification(alice, id: "n_4")), reason: .deleted, at: t0 + 1)
        try assertCountsMatchHistory(s, alice)
        XCTAssertEqual(try s.notification(alice, id: "n_5"), n5)
        _ = try s.pruneChanges(before: t0 + 10)
        XCTAssertEqual(try s.notification(alice, id: "n_5"), n5)
        XCTAssertEqual(try s.notification(alice, id: "n_3"), stored["n_3"])
        try assertCountsMatchHistory(s, alice)
    }

    /// A notification's JSON is written once, in its change, which stays
    /// below the floor when pruned until the notification changes or goes.
    func testANotificationsJSONIsWrittenOnce() throws {
        let s = try SQLiteStore(path: path, durability: .off)
        let reader = try XCTUnwrap(s.makeReader())
        let big: JSONObject = ["text": .string(String(repeating: "x", count: 60_000))]
        let pages = try XCTUnwrap(s.db.int("PRAGMA page_count"))
        for k in 0..<10 { _ = try s.upsert(alice, note("n_\(k)", "a\(k)", payload: big), previous: nil, at: t0) }
        // 600 KB of payloads: one copy is ~147 pages of 4 KiB, two ~294.
        let grown = try XCTUnwrap(s.db.int("PRAGMA page_count")) - pages
        XCTAssertLessThan(grown, 200, "pages added for 10 notifications of 60 KB")
        XCTAssertEqual(try s.db.int("SELECT sum(length(json)) FROM notifications"), 0)

        XCTAssertEqual(try s.pruneChanges(before: t0 + 1), 10)
        XCTAssertEqual(try s.feed(alice), FeedState(head: 10, floor: 10))
        XCTAssertEqual(try s.changes(alice, after: 0, limit: 20).count, 0, "kept changes are not served")
        XCTAssertEqual(try s.db.int("SELECT count(*) FROM changes"), 10, "each kept for its notification")
        XCTAssertEqual(try s.history(alice, after: nil, limit: 20).map(\.payload), Array(repeating: big, count: 10))
        XCTAssertEqual(try reader.read { r throws(StoreError) in try r.notification(alice, id: "n_3") }?.payload, big)
        XCTAssertEqual(try s.pruneChanges(before: t0 + 2), 0, "kept changes are not pruned again")

        // Changed or deleted, a notification lets go of its kept change.
        var n0 = try XCTUnwrap(s.notification(alice, id: "n_0"))
        n0.readState = .read
        n0.version += 1
        _ = try s.upsert(alice, n0, previous: nil, at: t0 + 5)
        _ = try s.delete(alice, try XCTUnwrap(s.notification(alice, id: "n_1")), reason: .deleted, at: t0 + 5)
        XCTAssertEqual(try s.db.int("SELECT count(*) FROM changes WHERE seq <= 10"), 8)
        XCTAssertEqual(try s.changes(alice, after: 10, limit: 20).map(\.seq), [11, 12])
        XCTAssertEqual(try s.notification(alice, id: "n_0"), n0)
        XCTAssertEqual(try reader.read { r throws(StoreError) in try r.history(alice, after: nil, limit: 20) }.count, 9)
        XCTAssertEqual(try s.pruneChanges(before: t0 + 10), 2)
        XCTAssertEqual(try s.db.int("SELECT count(*) FROM changes"), 9, "the delete went, the change n_0 points at stays")
        XCTAssertEqual(try s.notification(alice, id: "n_0"), n0)
    }

    /// A limited call may end inside an instant (a send to many users
    /// writes all their changes at one): it records the change it stopped
    /// at, and the next call starts there.
    func testPruningInsideAnInstantResumesWhereItStopped() throws {
        let s = try SQLiteStore(path: path, durability: .off)
        let users = (0..<5).map { UserKey(app: "app1", user: "u\($0)") }
        for u in users { _ = try s.upsert(u, note("n_\(u.user)", "a"), previous: nil, at: t0) }
        func stored() throws -> String? { try s.db.text("SELECT value FROM meta WHERE key = 'pruned_before'") }
        XCTAssertEqual(try s.pruneChanges(before: t0 + 1, limit: 2), Pruned(changes: 2, more: true))
        XCTAssertEqual(try stored(), "\(t0)\tapp1\tu2\t1")
        XCTAssertEqual(try users.map { try s.feed($0).floor }, [1, 1, 0, 0, 0])
        XCTAssertEqual(try s.pruneChanges(before: t0 + 1, limit: 2), Pruned(changes: 2, more: true))
        XCTAssertEqual(try s.pruneChanges(before: t0 + 1, limit: 2), Pruned(changes: 1, more: false))
        XCTAssertEqual(try stored(), String(t0 + 1))
        XCTAssertEqual(try users.map { try s.feed($0).floor }, [1, 1, 1, 1, 1])
        XCTAssertEqual(SQLiteStore.PruneKey(stored: String(t0)), SQLiteStore.PruneKey(at: t0), "the form before keys")
    }

    /// A pass looks only at the changes recorded since the last one's
    /// cutoff, unless the clock went back past it.
    func testPruningLooksAtChangesSinceTheLastPassUnlessTheClockWentBack() throws {
        let s = try SQLiteStore(path: path, durability: .off)
        _ = try s.upsert(alice, note("n_1", "a1"), previous: nil, at: t0)
        XCTAssertEqual(try s.pruneChanges(before: t0 + 1), 1)
        XCTAssertEqual(try s.db.text("SELECT value FROM meta WHERE key = 'pruned_before'"), String(t0 + 1))
        _ = try s.upsert(alice, note("n_2", "a2"), previous: nil, at: t0)  // recorded before that cutoff
        XCTAssertEqual(try s.pruneChanges(before: t0 + 2), 0)
        XCTAssertEqual(try s.feed(alice), FeedState(head: 2, floor: 1))
        XCTAssertEqual(try s.pruneChanges(before: t0 + 1), 1, "the clock went back: every change is looked at")
        XCTAssertEqual(try s.feed(alice), FeedState(head: 2, floor: 2))
        XCTAssertEqual(try s.db.text("SELECT value FROM meta WHERE key = 'pruned_before'"), String(t0 + 1))
        XCTAssertEqual(try s.history(alice, after: nil, limit: 5).map(\.id).sorted(), ["n_1", "n_2"])
    }

    // MARK: Readers

    func testReaderSeesOnlyCommittedWrites() throws {
        let s = try SQLiteStore(path: path, durability: .off)
        let reader = try XCTUnwrap(s.makeReader())
        XCTAssertEqual(reader.epoch, s.epoch)
        XCTAssertEqual(try reader.counts(alice), [])
        let n1 = note("n_1", "a1")
        _ = try s.upsert(alice, n1, previous: nil, at: t0)

        try s.begin()
        _ = try s.upsert(alice, note("n_2", "a2"), previous: nil, at: t0)
        _ = try s.delete(alice, n1, reason: .deleted, at: t0)
        try s.saveDevice(alice, Device(deviceId: "d1", lastSeenAt: 1))
        XCTAssertEqual(try reader.feed(alice).head, 1)
        XCTAssertEqual(try reader.notification(alice, id: "n_1"), n1)
        XCTAssertNil(try reader.notification(alice, id: "n_2"))
        XCTAssertEqual(try reader.changes(alice, after: 0, limit: 10).count, 1)
        XCTAssertEqual(try reader.history(alice, after: nil, limit: 10), [n1])
        XCTAssertEqual(try reader.counts(alice).map(\.total), [1])
        XCTAssertEqual(try reader.devices(alice), [])
        try s.commit()

        XCTAssertEqual(try reader.feed(alice).head, 3)
        XCTAssertNil(try reader.notification(alice, id: "n_1"))
        XCTAssertEqual(try reader.history(alice, after: nil, limit: 10).map(\.id), ["n_2"])
        XCTAssertEqual(try reader.changes(alice, after: 0, limit: 10).map(\.encoded), try s.changes(alice, after: 0, limit: 10).map(\.encoded))
        XCTAssertEqual(try reader.counts(alice), try s.counts(alice))
        XCTAssertEqual(try reader.devices(alice).map(\.deviceId), ["d1"])

        // Rolled back: never seen.
        try s.begin()
        _ = try s.upsert(alice, note("n_3", "a3"), previous: nil, at: t0)
        s.rollback()
        XCTAssertEqual(try reader.feed(alice).head, 3)
        XCTAssertNil(try reader.notification(alice, id: "n_3"))
    }

    typealias Seen = (head: Int64, history: Int, total: Int)
    func seen(_ r: StoreReading) throws(StoreError) -> Seen {
        let head = try r.feed(alice).head
        let history = try r.history(alice, after: nil, limit: 10).count
        return (head, history, try r.counts(alice).reduce(0) { $0 + $1.total })
    }

    func testReaderReadIsOneSnapshot() throws {
        let s = try SQLiteStore(path: path, durability: .off)
        let reader = try XCTUnwrap(s.makeReader())
        _ = try s.upsert(alice, note("n_1", "a1"), previous: nil, at: t0)
        let (first, second, nested) = try reader.read { r throws(StoreError) -> (Seen, Seen, Seen) in
            // Committed once `read` began, before its first read: not seen either.
            _ = try s.upsert(alice, note("n_2", "a2"), previous: nil, at: t0)
            let first = try seen(r)
            _ = try s.upsert(alice, note("n_3", "a3"), previous: nil, at: t0)
            let second = try seen(r)
            return (first, second, try reader.read { r throws(StoreError) in try seen(r) })
        }
        for v in [first, second, nested] {
            XCTAssertEqual(v.head, 1)
            XCTAssertEqual(v.history, 1)
            XCTAssertEqual(v.total, 1)
        }
        // Outside `read` each call is its own snapshot: the latest.
        XCTAssertEqual(try reader.feed(alice).head, 3)
        XCTAssertEqual(try seen(reader).total, 3)
        // A failing body ends its snapshot too.
        XCTAssertThrowsError(try reader.read { _ throws(StoreError) -> Int in throw StoreError("stop") })
        _ = try s.upsert(alice, note("n_4", "a4"), previous: nil, at: t0)
        XCTAssertEqual(try reader.read { r throws(StoreError) in try r.feed(alice).head }, 4)
    }

    func testReaderNeverWrites() throws {
        let s = try SQLiteStore(path: path)
        let reader = try XCTUnwrap(s.makeReader() as? SQLiteStoreReader)
        XCTAssertThrowsError(try reader.reads.db.execute("INSERT INTO meta (key, value) VALUES ('x', 'y')")) { e in
            XCTAssertTrue("\(e)".contains("readonly"), "\(e)")
        }
        XCTAssertNil(try s.db.text("SELECT value FROM meta WHERE key = 'x'"))
    }

    /// Checkpoints run on a thread of their own, not inside the engine's
    /// commits, and still copy the log whole so that it starts over from
    /// the top instead of growing.
    func testTheLogIsCheckpointedOffTheWritersThreadAndStartsOver() throws {
        let s = try SQLiteStore(path: path, durability: .off, checkpointPages: 32)
        let c = try XCTUnwrap(s.checkpointer)
        let body: JSONObject = ["body": .string(String(repeating: "x", count: 3_000))]
        var written = 0
        for _ in 0..<100 {
            try s.begin()
            for _ in 0..<5 {
                written += 1
                _ = try s.upsert(alice, note("n_\(written)", "a\(written)", payload: body), previous: nil, at: t0)
            }
            try s.commit()
        }
        // 100 commits of ~10 pages each went past 32 pages many times.
        let deadline = Date().addingTimeInterval(60)
        while c.completed.load(ordering: .relaxed) == 0 && Date() < deadline { usleep(1_000) }
        XCTAssertGreaterThan(c.completed.load(ordering: .relaxed), 0, "no checkpoint ran on the checkpoint thread")
        // With the writes over, the thread catches up, and a commit after
        // that starts the log over: few pages, not the ~1,000 written.
        var small = false
        while !small && Date() < deadline {
            written += 1
            _ = try s.upsert(alice, note("n_\(written)", "a\(written)"), previous: nil, at: t0)
            small = c.logPages.load(ordering: .relaxed) < 32
            if !small { usleep(1_000) }
        }
        XCTAssertTrue(small, "the log never started over: \(c.logPages.load(ordering: .relaxed)) pages")
        s.close()
        let reopened = try SQLiteStore(path: path)
        XCTAssertEqual(try reopened.db.int("SELECT count(*) FROM notifications"), Int64(written))
    }

    /// The thread copies (and syncs) every quarter of `checkpointPages`,
    /// not only once the log is full.
    func testTheLogIsCopiedInPassesLongBeforeItIsFull() throws {
        let s = try SQLiteStore(path: path, durability: .full, checkpointPages: 400)
        let c = try XCTUnwrap(s.checkpointer)
        let body: JSONObject = ["body": .string(String(repeating: "x", count: 3_000))]
        var written = 0
        // Past a quarter of the log (a pass that caught up lets the log
        // start over, so stop at the first pass too).
        while c.logPages.load(ordering: .relaxed) < 150 && c.completed.load(ordering: .relaxed) == 0 && written < 1_000 {
            written += 1
            _ = try s.upsert(alice, note("n_\(written)", "a\(written)", payload: body), previous: nil, at: t0)
        }
        let deadline = Date().addingTimeInterval(30)
        while c.completed.load(ordering: .relaxed) == 0 && Date() < deadline { usleep(1_000) }
        XCTAssertGreaterThan(c.completed.load(ordering: .relaxed), 0, "no pass at \(c.logPages.load(ordering: .relaxed)) of 400 pages")
        s.close()
        let reopened = try SQLiteStore(path: path)
        XCTAssertEqual(try reopened.db.int("SELECT count(*) FROM notifications"), Int64(written))
    }

    /// Commits after B-tree balances skip the page cache's scan (the wrapper
    /// in Sources/CSQLitePageCache), and a rollback that grew the file still
    /// drops the pages past its end: growing the file again afterwards must
    /// not find the rolled-back rows in the cache.
    func testCommitsSkipThePageCacheScanAndRollbacksStillDropNewPages() throws {
        XCTAssertTrue(SQLiteDatabase.pageCacheWrapped)
        let s = try SQLiteStore(path: path)
        var rng = SplitMix64(seed: 7)
        func publish(_ n: Int, tag: String) throws {
            for i in 0..<n {
                let user = UserKey(app: "app1", user: "u\(rng.next() % 100_000)")
                _ = try s.upsert(user, note("n_\(tag)\(i)", "a\(tag)\(i)"), previous: nil, at: t0)
            }
        }
        let start = SQLiteDatabase.pageCacheTruncations
        try s.begin()
        try publish(2_000, tag: "kept")
        try s.commit()
        let committed = SQLiteDatabase.pageCacheTruncations
        XCTAssertGreaterThan(committed.skipped, start.skipped, "the commit's truncation was not skipped")

        try s.begin()
        try publish(2_000, tag: "undone")
        s.rollback()
        XCTAssertGreaterThan(SQLiteDatabase.pageCacheTruncations.passed, committed.passed,
                             "the rollback did not drop the pages past the file's end")
        try s.begin()
        try publish(2_000, tag: "again")
        try s.commit()

        for db in [s.db, try SQLiteDatabase(path: path)] {
            XCTAssertEqual(try db.text("PRAGMA integrity_check"), "ok")
            XCTAssertEqual(try db.int("SELECT count(*) FROM notifications"), 4_000)
            XCTAssertEqual(try db.int("SELECT count(*) FROM notifications WHERE id LIKE 'n_undone%'"), 0)
        }
    }

    func testInMemoryDatabaseHasNoReader() throws {
        XCTAssertNil(try SQLiteStore(path: ":memory:").makeReader())
    }

    /// The gateway's use: catch-ups paged on a reader thread while the
    /// engine commits batches. Every snapshot must be whole (no gap in the
    /// changes, counts agreeing with the notifications) and no read may fail.
    func testReaderOnAnotherThreadReadsWhileTheOwnerCommits() throws {
        // Checkpoint often, so checkpoints run while the reader holds snapshots.
        let s = try SQLiteStore(path: path, durability: .off, checkpointPages: 8)
        let reading = ReaderThread(reader: try XCTUnwrap(s.makeReader()), user: alice)
        Thread { reading.run() }.start()

        var live: [Notification] = []
        for b in 0..<60 {
            try s.begin()
            for k in 0..<8 {
                let i = b * 8 + k
                if i % 3 == 2, let n = live.first {
                    _ = try s.delete(alice, n, reason: .deleted, at: t0)
                    live.removeFirst()
                } else if i % 3 == 1, var n = live.last {
                    n.readState = .read
                    n.version += 1
                    _ = try s.upsert(alice, n, previous: live.last, at: t0)
                    live[live.count - 1] = n
                } else {
                    var n = note("n_\(i)", "a\(i)")
                    n.createdAt += Millis(i)
                    _ = try s.upsert(alice, n, previous: nil, at: t0)
                    live.append(n)
                }
            }
            try s.commit()
        }
        reading.finish(head: try s.feed(alice).head)
        XCTAssertEqual(reading.done.wait(timeout: .now() + 120), .success, "the reader never caught up")
        XCTAssertEqual(reading.errors, [])
        XCTAssertGreaterThan(reading.snapshots, 0)
    }

    // MARK: Failures become StoreErrors, never half-writes

    /// A second store on an open file (another gateway started by mistake)
    /// is refused before it touches the file; once the first closes, the
    /// file opens again at once.
    func testASecondStoreOnAnOpenFileIsRefused() throws {
        let a = try SQLiteStore(path: path)
        let first = try a.upsert(alice, note("n_1", "a1"), previous: nil, at: t0)
        XCTAssertThrowsError(try SQLiteStore(path: path)) { e in
            XCTAssertTrue("\(e)".contains("another gateway (pid \(getpid())) has this database open"), "\(e)")
            XCTAssertTrue("\(e)".contains(path), "names the file: \(e)")
        }
        // Through a symlink too: one file, one lock.
        let link = dir.appendingPathComponent("link.db").path
        try FileManager.default.createSymbolicLink(atPath: link, withDestinationPath: path)
        XCTAssertThrowsError(try SQLiteStore(path: link))
        XCTAssertEqual(try a.feed(alice).head, first.seq)
        a.close()
        let b = try SQLiteStore(path: path)
        XCTAssertEqual(try b.feed(alice).head, first.seq)
    }

    /// Every path to one file names one lock: through a link to a file not
    /// made yet, and through `..` after a linked folder (the kernel's `..`,
    /// the link target's parent, not the text's).
    func testEveryPathToOneFileTakesOneLock() throws {
        let fm = FileManager.default
        let real = dir.appendingPathComponent("real").path, etc = dir.appendingPathComponent("etc").path
        try fm.createDirectory(atPath: real, withIntermediateDirectories: true)
        try fm.createDirectory(atPath: etc, withIntermediateDirectories: true)
        try fm.createSymbolicLink(atPath: etc + "/herald.db", withDestinationPath: real + "/herald.db")  // dangling
        let first = try SQLiteStore(path: etc + "/herald.db")
        XCTAssertThrowsError(try SQLiteStore(path: real + "/herald.db"), "the same file, by its own name")
        try fm.createDirectory(atPath: real + "/sub", withIntermediateDirectories: true)
        try fm.createSymbolicLink(atPath: etc + "/sub", withDestinationPath: real + "/sub")
        XCTAssertThrowsError(try SQLiteStore(path: etc + "/sub/../herald.db"), "`..` of a linked folder is its target's parent")
        first.close()
        XCTAssertEqual(SQLiteFileLock.canonical(etc + "/sub/../herald.db"), SQLiteFileLock.canonical(real + "/herald.db"))
    }

    /// A write lock held by another connection (an operator's `sqlite3`
    /// shell, say) fails a write after the busy timeout; reads go on.
    func testLockedDatabaseIsAStoreError() throws {
        let s = try SQLiteStore(path: path, busyTimeoutMillis: 50)
        let first = try s.upsert(alice, note("n_1", "a1"), previous: nil, at: t0)
        let shell = try SQLiteDatabase(path: path)
        try shell.execute("BEGIN IMMEDIATE")
        XCTAssertThrowsError(try s.upsert(alice, note("n_2", "a2"), previous: nil, at: t0)) { e in
            XCTAssertTrue("\(e)".contains("locked"), "\(e)")
        }
        XCTAssertThrowsError(try s.begin())
        s.rollback()
        XCTAssertEqual(try s.feed(alice).head, first.seq, "readers are not blocked by the writer")
        try shell.execute("COMMIT")
        let second = try s.upsert(alice, note("n_2", "a2"), previous: nil, at: t0)
        XCTAssertGreaterThan(second.seq, first.seq)
    }

    func testFailedWriteLeavesNothingHalfWritten() throws {
        let s = try SQLiteStore(path: path)
        let ok = try s.upsert(alice, note("n_1", "a1"), previous: nil, at: t0)
        // A second notification with the same appNotificationId breaks the
        // unique index: the whole write is undone, seq included.
        XCTAssertThrowsError(try s.upsert(alice, note("n_2", "a1"), previous: nil, at: t0))
        XCTAssertEqual(try s.feed(alice).head, ok.seq)
        XCTAssertEqual(try s.changes(alice, after: 0, limit: 10).map(\.seq), [ok.seq])
        try assertCountsMatchHistory(s, alice)

        // Inside a batch only the failed write is undone.
        try s.begin()
        let b1 = try s.upsert(alice, note("n_3", "a3"), previous: nil, at: t0)
        XCTAssertThrowsError(try s.upsert(alice, note("n_4", "a3"), previous: nil, at: t0))
        try s.commit()
        XCTAssertEqual(try s.feed(alice).head, b1.seq)
        XCTAssertEqual(try s.changes(alice, after: 0, limit: 10).map(\.seq), [ok.seq, b1.seq])
        try assertCountsMatchHistory(s, alice)
    }

    func testFullDiskIsAStoreErrorAndTheStoreRecovers() throws {
        let s = try SQLiteStore(path: path)
        let kept = try s.upsert(alice, note("n_0", "a0"), previous: nil, at: t0)
        let pages = try XCTUnwrap(s.db.int("PRAGMA page_count"))
        XCTAssertNotNil(try s.db.int("PRAGMA max_page_count = \(pages + 4)"))
        let big: JSONObject = ["blob": .string(String(repeating: "x", count: 60_000))]
        var failure: StoreError?
        try s.begin()
        for k in 1...20 {
            do { _ = try s.upsert(alice, note("n_\(k)", "a\(k)", payload: big), previous: nil, at: t0) } catch {
                failure = error
                break
            }
        }
        let error = try XCTUnwrap(failure, "the disk never filled")
        XCTAssertTrue(error.description.contains("full"), error.description)
        // Whatever SQLite did with the transaction, the caller can roll back
        // or try to commit and gets an answer, not a crash.
        s.rollback()
        XCTAssertEqual(try s.feed(alice).head, kept.seq)
        XCTAssertEqual(try s.history(alice, after: nil, limit: 50).map(\.id), ["n_0"])

        XCTAssertNotNil(try s.db.int("PRAGMA max_page_count = 1073741823"))
        let next = try s.upsert(alice, note("n_1", "a1", payload: big), previous: nil, at: t0)
        XCTAssertEqual(next.seq, kept.seq + 1)
    }

    func testAbortedTransactionRefusesWorkUntilRolledBack() throws {
        let s = try SQLiteStore(path: path)
        try s.begin()
        _ = try s.upsert(alice, note("n_1", "a1"), previous: nil, at: t0)
        // Simulate SQLite ending the transaction by itself (as it may after
        // SQLITE_FULL or SQLITE_IOERR).
        try s.db.execute("ROLLBACK")
        XCTAssertThrowsError(try s.upsert(alice, note("n_2", "a2"), previous: nil, at: t0)) { e in
            XCTAssertTrue("\(e)".contains("rolled back"), "\(e)")
        }
        XCTAssertThrowsError(try s.commit())
        XCTAssertEqual(try s.feed(alice).head, 0)
        try s.begin()
        _ = try s.upsert(alice, note("n_2", "a2"), previous: nil, at: t0)
        try s.commit()
        XCTAssertEqual(try s.feed(alice).head, 1)
    }

    func testClosedStoreThrows() throws {
        let s = try SQLiteStore(path: path)
        s.close()
        XCTAssertThrowsError(try s.feed(alice))
        XCTAssertThrowsError(try s.begin())
        XCTAssertThrowsError(try s.makeReader())
        s.rollback()
        s.close()
    }

    func testCorruptRowIsAStoreError() throws {
        let s = try SQLiteStore(path: path)
        _ = try s.upsert(alice, note("n_1", "a1"), previous: nil, at: t0)
        try s.db.execute("UPDATE notifications SET json = '{\"id\": 3'")
        try s.db.execute("UPDATE changes SET change = '[]'")
        XCTAssertThrowsError(try s.notification(alice, id: "n_1"))
        XCTAssertThrowsError(try s.history(alice, after: nil, limit: 10))
        XCTAssertThrowsError(try s.changes(alice, after: 0, limit: 10))
        XCTAssertThrowsError(try s.due(.expiry, until: .max, limit: 10))
        try s.saveDevice(alice, Device(deviceId: "d", lastSeenAt: 1))
        try s.db.execute("UPDATE devices SET platform = 'toaster'")
        XCTAssertThrowsError(try s.devices(alice))
        XCTAssertThrowsError(try s.usersWithDevices(app: "app1"))
    }

    // MARK: Indexes

    func plan(_ s: SQLiteStore, _ sql: String, _ args: Int) throws -> String {
        var lines: [String] = []
        try s.db.query("EXPLAIN QUERY PLAN " + sql, Array(repeating: .int(0), count: args)) { r throws(StoreError) in
            lines.append(r.text(3) ?? "")
            return true
        }
        return lines.joined(separator: "; ")
    }

    func testQueriesUseIndexes() throws {
        let s = try SQLiteStore(path: path)
        let cases: [(String, Int, String)] = [
            (SQLiteStore.historyFirstSQL, 3, "notifications_by_id"),
            (SQLiteStore.historyAfterSQL, 6, "notifications_by_id"),
            (SQLiteStore.changesAfterSQL, 4, "PRIMARY KEY"),
            (SQLiteStore.dueSQL(.expiry), 2, "notifications_expiry"),
            (SQLiteStore.dueSQL(.wake), 2, "notifications_wake"),
            (SQLiteStore.pruneScanSQL, 8, "changes_by_at"),
            (SQLiteStore.pruneBoundarySQL, 6, "changes_by_at"),
            (SQLiteStore.notificationByIdSQL, 3, "notifications_by_id"),
            (SQLiteStore.notificationByAppIdSQL, 3, "notifications_by_app_id"),
        ]
        for (sql, args, index) in cases {
            let p = try plan(s, sql, args)
            XCTAssertTrue(p.hasPrefix("SEARCH") && p.contains("USING") && p.contains(index), p)
            if sql != SQLiteStore.pruneScanSQL { XCTAssertFalse(p.contains("TEMP B-TREE"), p) }
        }
        XCTAssertTrue(try plan(s, SQLiteStore.pruneScanSQL, 8).contains("COVERING INDEX changes_by_at ((at,app,user,seq)>"))
        XCTAssertTrue(try plan(s, SQLiteStore.pruneBoundarySQL, 6).contains("COVERING INDEX changes_by_at ((at,app,user,seq)>"))
        for d in Deadline.allCases {
            let p = try plan(s, SQLiteStore.nextSQL(d), 0)
            XCTAssertTrue(p.contains("SEARCH notifications USING COVERING INDEX notifications_\(d == .expiry ? "expiry" : "wake")"), p)
        }
        let counts = try plan(s, SQLiteStore.countsSQL, 2)
        XCTAssertTrue(counts.contains("SEARCH feeds USING PRIMARY KEY (app=? AND user=?)")
                      && counts.contains("SEARCH counts USING PRIMARY KEY (app=? AND user=?)") && !counts.contains("SCAN"), counts)
        // Each notification's change by its key; each pointed-at row by its id.
        for (sql, args) in [(SQLiteStore.historyFirstSQL, 3), (SQLiteStore.historyAfterSQL, 6), (SQLiteStore.dueSQL(.expiry), 2),
                            (SQLiteStore.notificationByIdSQL, 3), (SQLiteStore.notificationByAppIdSQL, 3)] {
            let p = try plan(s, sql, args)
            XCTAssertTrue(p.contains("SEARCH c USING PRIMARY KEY (app=? AND user=? AND seq=?)"), p)
        }
        let prune = try plan(s, SQLiteStore.pruneUserSQL, 4)
        XCTAssertTrue(prune.contains("SEARCH changes USING PRIMARY KEY (app=? AND user=? AND seq>? AND seq<?)")
                      && prune.contains("SEARCH n USING INDEX notifications_by_id (app=? AND user=? AND id=?)"), prune)
        XCTAssertTrue(try plan(s, SQLiteStore.changesAfterSQL, 4).contains("SEARCH changes USING PRIMARY KEY (app=? AND user=? AND seq>?)"))
        let holders = try plan(s, SQLiteStore.pushDevicesSQL, 2)
        XCTAssertTrue(holders.contains("SEARCH d USING INDEX devices_with_push (app=? AND user=?)"), holders)
        // History reads the index by id backwards, its range bounded by it.
        XCTAssertTrue(try plan(s, SQLiteStore.historyFirstSQL, 3).contains("notifications_by_id (app=? AND user=?)"))
        let history = try plan(s, SQLiteStore.historyAfterSQL, 6)
        XCTAssertTrue(history.contains("notifications_by_id (app=? AND user=? AND id<?)"), "the range is bounded by the index: \(history)")
    }
}

/// The reading side of `testReaderOnAnotherThreadReadsWhileTheOwnerCommits`:
/// reads snapshots in a loop until it has seen the head the owner finished at.
final class ReaderThread: @unchecked Sendable {
    let reader: StoreReader
    let user: UserKey
    let done = DispatchSemaphore(value: 0)
    private let lock = NSLock()
    private var finalHead: Int64?
    private var _errors: [String] = []
    private var _snapshots = 0

    init(reader: StoreReader, user: UserKey) { self.reader = reader; self.user = user }

    var errors: [String] { lock.withLock { _errors } }
    var snapshots: Int { lock.withLock { _snapshots } }
    func finish(head: Int64) { lock.withLock { finalHead = head } }

    func run() {
        defer { done.signal() }
        var cursor: Int64 = 0
        while true {
            // Read before the snapshot: once set, the snapshot has every commit.
            let final = lock.withLock { finalHead }
            do {
                cursor = try reader.read { r throws(StoreError) -> Int64 in try check(r, from: cursor) }
                lock.withLock { _snapshots += 1 }
            } catch {
                lock.withLock { _errors.append("\(error)") }
                return
            }
            if let final {
                if cursor != final { lock.withLock { _errors.append("saw head \(cursor), not \(final)") } }
                return
            }
        }
    }

    /// Pages through the changes after `cursor` and the whole history of
    /// one snapshot; returns its head.
    private func check(_ r: StoreReading, from cursor: Int64) throws(StoreError) -> Int64 {
        let head = try r.feed(user).head
        var seq = cursor
        while seq < head {
            let page = try r.changes(user, after: seq, limit: 7)
            guard let last = page.last?.seq, page.map(\.seq) == Array(seq + 1 ... last) else {
                throw StoreError("changes after \(seq) of head \(head): \(page.map(\.seq))")
            }
            seq = last
        }
        var history: [Notification] = []
        while true {
            let page = try r.history(user, after: history.last.map(HistoryKey.init), limit: 5)
            history += page
            if page.count < 5 { break }
        }
        let counts = try r.counts(user)
        let total = counts.reduce(0) { $0 + $1.total }, unread = counts.reduce(0) { $0 + $1.unread }
        guard total == history.count, unread == history.filter({ $0.readState == .unread }).count else {
            throw StoreError("counts \(total)/\(unread) for \(history.count) notifications at head \(head)")
        }
        return head
    }
}

#if canImport(Glibc)
import Glibc

/// `kill -9` at any moment: a child process publishes in batches and
/// reports each committed batch's last seq through a pipe; the parent kills
/// it at a random point, then checks that everything reported is on disk and
/// that seq continues past it. (A killed process leaves the OS's page cache
/// intact: this proves crash safety of the process, as `.normal` would too;
/// power loss is what `.full` adds.)
final class SQLiteStoreCrashTests: XCTestCase {
    func testKilledWriterLosesNothingAcknowledged() throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("herald-crash-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: dir) }
        let path = dir.appendingPathComponent("herald.db").path
        let alice = UserKey(app: "app1", user: "alice")
        let epoch = try SQLiteStore(path: path).epoch
        var acknowledged = 0

        for round in 0..<15 {
            var fds: [Int32] = [0, 0]
            XCTAssertEqual(pipe(&fds), 0)
            let pid = fork()
            if pid == 0 {
                // Child: no XCTest from here on, only the store and _exit.
                close(fds[0])
                guard let s = try? SQLiteStore(path: path, durability: .full) else { _exit(3) }
                var k = 0
                while true {
                    do {
                        try s.begin()
                        var last: Int64 = 0
                        for _ in 0..<Int.random(in: 1...8) {
                            k += 1
                            let t: Millis = 1_800_000_000_000 + Millis(round * 100_000 + k)
                            let n = Notification(id: "n_\(round)_\(k)", appNotificationId: "a\(round)-\(k)", userId: "alice",
                                                 payload: ["k": .int(k)], createdAt: t, updatedAt: t, expiresAt: t + 1_000_000)
                            last = try s.upsert(alice, n, previous: nil, at: t).seq
                        }
                        try s.commit()
                        var msg: (Int64, Int64) = (last, Int64(k))
                        guard write(fds[1], &msg, 16) == 16 else { _exit(5) }
                    } catch {
                        _exit(4)
                    }
                }
            }
            XCTAssertGreaterThan(pid, 0)
            close(fds[1])
            // Let it commit a random number of batches, then kill it mid-burst.
            let killAfter = Int.random(in: 1...40)
            var acks: [(seq: Int64, count: Int64)] = []
            var msg: (Int64, Int64) = (0, 0)
            while read(fds[0], &msg, 16) == 16 {
                acks.append(msg)
                if acks.count == killAfter { kill(pid, SIGKILL) }
            }
            close(fds[0])
            var status: Int32 = 0
            waitpid(pid, &status, 0)
            XCTAssertGreaterThanOrEqual(acks.count, killAfter, "round \(round): the child died early (status \(status))")

            let s = try SQLiteStore(path: path)
            XCTAssertEqual(s.epoch, epoch)
            let head = try s.feed(alice).head
            if let last = acks.last {
                XCTAssertGreaterThanOrEqual(head, last.seq, "round \(round): an acknowledged seq is missing")
                for k in 1...Int(last.count) {
                    XCTAssertNotNil(try s.notification(alice, id: "n_\(round)_\(k)"), "round \(round): n_\(round)_\(k) lost")
                }
                acknowledged += Int(last.count)
            }
            let changes = try s.changes(alice, after: 0, limit: 1_000_000)
            XCTAssertEqual(changes.map(\.seq), head == 0 ? [] : Array(1...head), "round \(round): no gap, no repeat")
            let t: Millis = 1_900_000_000_000
            let next = try s.upsert(alice, Notification(id: "n_after_\(round)", appNotificationId: "after-\(round)", userId: "alice",
                                                        payload: [:], createdAt: t, updatedAt: t, expiresAt: t + 1000), previous: nil, at: t)
            XCTAssertEqual(next.seq, head + 1, "seq continues without reuse")
            s.close()
        }
        XCTAssertGreaterThan(acknowledged, 15)
    }
}
#endif
