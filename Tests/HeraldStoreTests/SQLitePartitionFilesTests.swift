import Foundation
import XCTest
import HeraldCore
@testable import HeraldStores

/// A SQLite store over several files, one per partition: every user's rows
/// in its partition's file, moved between files when the count changes,
/// and a move stopped at any step finished at the next open.
final class SQLitePartitionFilesTests: XCTestCase {
    var dir: URL!
    var base: String { dir.appendingPathComponent("herald.db").path }
    let t0: Millis = 1_800_000_000_000
    let users = (0..<40).map { UserKey(app: $0 % 3 == 0 ? "app2" : "app1", user: "user-\($0)") }

    override func setUpWithError() throws {
        dir = FileManager.default.temporaryDirectory.appendingPathComponent("herald-parts-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
    }

    override func tearDown() {
        if let dir { try? FileManager.default.removeItem(at: dir) }
        super.tearDown()
    }

    func open(_ count: Int?, at base: String? = nil) throws -> [SQLiteStore] {
        try SQLitePartitionFiles.open(base: base ?? self.base, count: count) { p throws(StoreError) in try SQLiteStore(path: p) }
    }

    func note(_ u: UserKey, _ i: Int) -> Notification {
        Notification(id: NotificationID.make(now: t0 + Millis(i)), appNotificationId: "a\(i)", userId: u.user,
                     payload: ["title": .string("\(u.user) \(i)")], createdAt: t0 + Millis(i), updatedAt: t0 + Millis(i),
                     expiresAt: t0 + 86_400_000)
    }

    /// Users with notifications (one deleted), devices (some with a push
    /// handle and a waiting push), preferences, and webhook deliveries, in
    /// the single file of a Herald from before partition files.
    func seedOneFile() throws {
        let store = try SQLiteStore(path: base)
        for (k, u) in users.enumerated() {
            try store.begin()
            let first = note(u, 1)
            _ = try store.upsert(u, first, previous: nil, at: t0)
            var targeted = note(u, 5)
            targeted.targetPlatforms = [.ios]
            _ = try store.upsert(u, targeted, previous: nil, at: t0)  // a row in `counts`
            for i in 2...4 { _ = try store.upsert(u, note(u, i), previous: nil, at: t0) }
            _ = try store.delete(u, first, reason: .deleted, at: t0 + 1)
            try store.saveDevice(u, Device(deviceId: "a", platform: .ios, tags: ["t\(k)"], lastSeenAt: t0))
            if k % 2 == 0 {
                try store.saveDevice(u, Device(deviceId: "b", lastSeenAt: t0, push: .fcm(token: "token-\(k)")))
                try store.enqueuePush(u, deviceId: "b", PushMessage(kind: .tap, op: .state, cursor: 1, epoch: store.epoch,
                                                                    notificationId: nil, expiresAt: t0 + 86_400_000),
                                      at: t0, claimUntil: nil)
                try store.spaceTaps(u, deviceId: "b", until: t0 + 60_000)
            }
            if k % 5 == 0 { _ = try store.savePreferences(u, Preferences(default: Channels(inbox: true, push: false), version: 1), at: t0) }
            try store.enqueueWebhook(app: u.app, url: "https://hooks.example/\(k)", eventId: "evt-\(k)", body: Array("{}".utf8), at: t0)
            try store.commit()
        }
        store.close()
    }

    /// What each user's rows read as, from the store of its partition.
    func snapshot(_ stores: [SQLiteStore]) throws -> [UserKey: String] {
        var out: [UserKey: String] = [:]
        for u in users {
            let s = stores[Partition.index(of: u, among: stores.count)]
            let changes = try s.changes(u, after: 0, limit: 100).map { String(decoding: $0.encoded, as: UTF8.self) }
            let live = try (1...5).map { try s.notification(u, appNotificationId: "a\($0)")?.id ?? "-" }
            let counts = try s.counts(u).map { "\($0)" }.sorted()
            let spacing = try s.db.int("SELECT not_before FROM push_tap_spacing WHERE app = ? AND user = ?", [.text(u.app), .text(u.user)])
            out[u] = "\(try s.feed(u)) \(changes) \(live) \(counts) \(try s.devices(u)) \(try s.pendingPushes(u)) \(spacing ?? 0) \(try s.preferences(u).json)"
        }
        return out
    }

    func webhookEvents(_ stores: [SQLiteStore]) throws -> Set<String> {
        XCTAssertEqual(try stores.map { s in try s.db.int("SELECT deliveries FROM webhook_outbox_size") },
                       try stores.map { s in try s.db.int("SELECT count(*) FROM webhook_outbox") }, "each file counts its own")
        var ids = Set<String>()
        for s in stores {
            for (k, u) in users.enumerated() {
                for job in try s.claimWebhooks(app: u.app, url: "https://hooks.example/\(k)", now: t0, until: t0, limit: 10) {
                    XCTAssertTrue(ids.insert(job.eventId).inserted, "\(job.eventId) twice")
                }
            }
        }
        return ids
    }

    func assertEachUserOnlyInItsFile(_ stores: [SQLiteStore], file: StaticString = #filePath, line: UInt = #line) throws {
        for u in users {
            for (i, s) in stores.enumerated() where i != Partition.index(of: u, among: stores.count) {
                XCTAssertEqual(try s.feed(u).head, 0, "\(u) in partition \(i)", file: file, line: line)
                XCTAssertEqual(try s.devices(u), [], file: file, line: line)
            }
        }
    }

    func close(_ stores: [SQLiteStore]) { for s in stores { s.close() } }

    func files() throws -> [String] {
        try FileManager.default.contentsOfDirectory(atPath: dir.path).filter { !$0.hasSuffix(".lock") && !$0.hasSuffix("-wal") && !$0.hasSuffix("-shm") }.sorted()
    }

    func testOneFileSplitsIntoThreeAndBackWithEveryUsersRows() throws {
        try seedOneFile()
        let one = try open(1)
        let before = try snapshot(one)
        let epoch = one[0].epoch
        close(one)

        let three = try open(3)
        XCTAssertEqual(try files(), ["herald.db", "herald.db.p1", "herald.db.p2"])
        XCTAssertEqual(Set(three.map(\.epoch)), [epoch], "one epoch: cursors stay valid wherever a user goes")
        XCTAssertEqual(try snapshot(three), before)
        try assertEachUserOnlyInItsFile(three)
        XCTAssertEqual(try three.map { try $0.pendingPushes() }.reduce(0, +), users.count / 2, "each file counts its own outbox")
        XCTAssertEqual(try three.map { try $0.pendingPushes() }, try three.map { s in try users.map { try s.pendingPushes($0).values.reduce(0, +) }.reduce(0, +) })
        // A user moved keeps writing at its next seq.
        let u = users.first { Partition.index(of: $0, among: 3) == 2 }!
        let head = try three[2].feed(u).head
        XCTAssertEqual(try three[2].upsert(u, note(u, 9), previous: nil, at: t0 + 9).seq, head + 1)
        let withNinth = try snapshot(three)
        close(three)

        let two = try open(2)
        XCTAssertEqual(try files(), ["herald.db", "herald.db.p1"], "the third file went once empty")
        XCTAssertEqual(try snapshot(two), withNinth)
        try assertEachUserOnlyInItsFile(two)
        close(two)

        let back = try open(1)
        XCTAssertEqual(try files(), ["herald.db"])
        XCTAssertEqual(try snapshot(back), withNinth)
        XCTAssertEqual(try webhookEvents(back), Set(users.indices.map { "evt-\($0)" }), "the webhook deliveries of files that went moved, once each")
        XCTAssertEqual(try back[0].pendingPushes(), users.count / 2)
        close(back)
    }

    /// Every step of a move, stopped there as by `kill -9`, then the next
    /// open: the same rows, every user once, whatever count it asks for.
    /// Splits (1 → 3) and merges (3 → 1) alike, and a move stopped twice.
    func testAMoveStoppedAtAnyStepIsFinishedAtTheNextOpen() throws {
        try seedOneFile()
        let original = try open(1)
        let expected = try snapshot(original)
        close(original)
        let seeded = dir.appendingPathComponent("seeded")
        let one = seeded.appendingPathComponent("one/herald.db").path
        let three = seeded.appendingPathComponent("three/herald.db").path
        for p in [one, three] {
            try FileManager.default.createDirectory(atPath: (p as NSString).deletingLastPathComponent, withIntermediateDirectories: true)
            try FileManager.default.copyItem(atPath: base, toPath: p)
        }
        close(try open(3, at: three))
        var runs = 0
        /// A copy of `source`'s files, moved to `first` stopped after `k` steps (nil: not stopped),
        /// then to `second` stopped after `j`, then opened with `final`.
        func check(_ source: String, _ moves: [(count: Int, stop: Int?)], final: Int) throws -> Bool {
            runs += 1
            let run = dir.appendingPathComponent("run-\(runs)")
            try FileManager.default.createDirectory(at: run, withIntermediateDirectories: true)
            let from = URL(fileURLWithPath: source).deletingLastPathComponent()
            for name in try FileManager.default.contentsOfDirectory(atPath: from.path) where !name.hasSuffix(".lock") {
                try FileManager.default.copyItem(at: from.appendingPathComponent(name), to: run.appendingPathComponent(name))
            }
            let p = run.appendingPathComponent("herald.db").path
            var stopped = false
            for move in moves {
                do { try SQLitePartitionFiles.arrange(base: p, count: move.count, log: { _ in }, stop: move.stop.map { .init($0) }) } catch {
                    XCTAssertEqual(error.description, "stopped")
                    stopped = true
                }
            }
            let stores = try open(final, at: p)
            defer { close(stores) }
            let got = try snapshot(stores)
            let differing = users.filter { got[$0] != expected[$0] }
            XCTAssertEqual(differing, [], "\(moves), then \(final): \(differing.first.map { "\(got[$0] ?? "none")" }?.prefix(300) ?? "")")
            try assertEachUserOnlyInItsFile(stores)
            XCTAssertEqual(try webhookEvents(stores), Set(users.indices.map { "evt-\($0)" }), "\(moves), then \(final)")
            XCTAssertEqual(SQLitePartitionFiles.filesPresent(p), Set(1..<final), "\(moves), then \(final)")
            return stopped
        }
        for (source, target, next) in [(one, 3, [3, 2]), (three, 1, [1, 2])] {
            for final in next {
                var k = 0
                while try check(source, [(target, k)], final: final) { k += 1 }
                XCTAssertGreaterThan(k, 4, "steps of a move to \(target)")
            }
        }
        // Stopped twice: 1 → 3 stopped, then → 2 stopped, then 1.
        for k in stride(from: 1, through: 10, by: 3) {
            for j in stride(from: 1, through: 10, by: 3) { _ = try check(one, [(3, k), (2, j)], final: 1) }
        }
    }

    func testAMissingPartitionFileIsRefusedAndNothingChanges() throws {
        try seedOneFile()
        close(try open(2))
        try FileManager.default.removeItem(atPath: base + ".p1")
        let before = try Data(contentsOf: URL(fileURLWithPath: base))
        for count in [1, 2, 3] {
            XCTAssertThrowsError(try open(count)) { e in
                XCTAssertTrue("\(e)".contains("herald.db.p1 of 2 is missing"), "\(e)")
            }
        }
        XCTAssertFalse(FileManager.default.fileExists(atPath: base + ".p1"), "not made anew")
        XCTAssertEqual(try Data(contentsOf: URL(fileURLWithPath: base)), before)
    }

    /// During a move from 3 files to 2, `.p1` is in both layouts: missing, it is refused, not made anew.
    func testAFileMissingDuringAMoveIsRefused() throws {
        try seedOneFile()
        close(try open(3))
        XCTAssertThrowsError(try SQLitePartitionFiles.arrange(base: base, count: 2, log: { _ in }, stop: .init(3)))
        try FileManager.default.removeItem(atPath: base + ".p1")
        XCTAssertThrowsError(try open(2)) { e in XCTAssertTrue("\(e)".contains("herald.db.p1 of 3 is missing"), "\(e)") }
        XCTAssertFalse(FileManager.default.fileExists(atPath: base + ".p1"))
    }

    func testAFileOfAnotherStoreIsRefused() throws {
        try seedOneFile()
        let two = try open(2)
        let holder = users.first { $0.app == "app1" && Partition.index(of: $0, among: 2) == 0 }!
        try two[0].saveDevice(holder, Device(deviceId: "h", lastSeenAt: t0, push: .fcm(token: "shared")))
        close(two)
        let other = dir.appendingPathComponent("other.db").path
        try seedOther(at: other)
        try FileManager.default.removeItem(atPath: base + ".p1")
        try FileManager.default.copyItem(atPath: other, toPath: base + ".p1")
        let before = try Data(contentsOf: URL(fileURLWithPath: base))
        XCTAssertThrowsError(try open(2)) { e in XCTAssertTrue("\(e)".contains("belongs to another store"), "\(e)") }
        XCTAssertThrowsError(try open(3)) { e in XCTAssertTrue("\(e)".contains("belongs to another store"), "\(e)") }
        XCTAssertThrowsError(try open(1)) { e in XCTAssertTrue("\(e)".contains("belongs to another store"), "\(e)") }
        XCTAssertEqual(try Data(contentsOf: URL(fileURLWithPath: base)), before, "refused before anything changed")
        XCTAssertEqual(SQLitePartitionFiles.filesPresent(base), [1], "no file made")
        let first = try SQLiteStore(path: base)
        XCTAssertEqual(try first.devices(holder).first { $0.deviceId == "h" }?.push, .fcm(token: "shared"), "the handle is untouched")
        first.close()
    }

    /// A stop just after a move made a file, before its tables: the next
    /// open takes it in (and, past the count, removes it).
    func testAFileLeftWithoutTablesIsTakenIn() throws {
        try seedOneFile()
        let one = try open(1)
        let expected = try snapshot(one)
        close(one)
        for i in [1, 2] { XCTAssertTrue(FileManager.default.createFile(atPath: base + ".p\(i)", contents: Data())) }
        let two = try open(2)
        XCTAssertEqual(try snapshot(two), expected)
        XCTAssertEqual(SQLitePartitionFiles.filesPresent(base), [1])
        close(two)
    }

    func testARestartWithoutACountKeepsTheLayout() throws {
        close(try open(nil))
        XCTAssertEqual(SQLitePartitionFiles.filesPresent(base), [], "a new store: one file")
        close(try open(3))
        let kept = try open(nil)
        XCTAssertEqual(kept.count, 3)
        close(kept)
        XCTAssertThrowsError(try SQLitePartitionFiles.arrange(base: base, count: 2, log: { _ in }, stop: .init(1)))
        let finished = try open(nil)
        XCTAssertEqual(finished.count, 2, "a move under way is finished to its count")
        XCTAssertEqual(SQLitePartitionFiles.filesPresent(base), [1])
        close(finished)
    }

    func testAMissingFirstFileIsRefusedAndNothingIsMade() throws {
        close(try open(2))
        for suffix in ["", "-wal", "-shm"] { try? FileManager.default.removeItem(atPath: base + suffix) }
        XCTAssertThrowsError(try open(2)) { e in XCTAssertTrue("\(e)".contains("partition 0 is missing"), "\(e)") }
        XCTAssertFalse(FileManager.default.fileExists(atPath: base))
    }

    private func seedOther(at p: String) throws {
        let s = try SQLiteStore(path: p)
        let u = UserKey(app: "app1", user: "stranger")
        _ = try s.upsert(u, note(u, 1), previous: nil, at: t0)
        try s.saveDevice(u, Device(deviceId: "s", lastSeenAt: t0 + 9, push: .fcm(token: "shared")))
        s.close()
    }

    /// Two users of different partitions may hold one push handle for a
    /// moment (the other partition gives it up in a batch after the commit
    /// that took it); a stop then leaves both holding it. At the next open
    /// the registration seen last keeps it, whichever file it is in, and the
    /// other loses it with its waiting pushes, with or without a move.
    func testAHandleHeldInTwoFilesGoesToTheRegistrationSeenLast() throws {
        let a = users.first { $0.app == "app1" && Partition.index(of: $0, among: 2) == 0 }!
        let b = users.first { $0.app == "app1" && Partition.index(of: $0, among: 2) == 1 }!
        let tap = PushMessage(kind: .tap, op: .state, cursor: 1, epoch: "e", notificationId: nil, expiresAt: t0 + 86_400_000)
        for (count, newer) in [(2, a), (2, b), (1, a), (1, b)] {
            try? FileManager.default.removeItem(at: dir)
            try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
            let two = try open(2)
            for (u, s) in [(a, two[0]), (b, two[1])] {
                try s.saveDevice(u, Device(deviceId: "d-\(u.user)", lastSeenAt: u == newer ? t0 + 5 : t0, push: .fcm(token: "shared")))
                try s.enqueuePush(u, deviceId: "d-\(u.user)", tap, at: t0, claimUntil: nil)
            }
            close(two)
            let stores = try open(count)
            func store(_ u: UserKey) -> SQLiteStore { stores[Partition.index(of: u, among: count)] }
            let older = newer == a ? b : a
            XCTAssertEqual(try store(newer).devices(newer).map(\.push), [.fcm(token: "shared")], "\(count) files")
            XCTAssertEqual(try store(older).devices(older).map(\.push), [nil], "\(count) files")
            XCTAssertEqual(try store(newer).pendingPushes(newer), ["d-\(newer.user)": 1])
            XCTAssertEqual(try store(older).pendingPushes(older), [:], "the old holder's waiting push went with the handle")
            XCTAssertEqual(try store(newer).pushHolder(app: "app1", key: PushHandle.fcm(token: "shared").key)?.user, newer.user)
            close(stores)
        }
    }
}
