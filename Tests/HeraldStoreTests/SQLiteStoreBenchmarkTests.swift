import Foundation
import XCTest
import HeraldCore
import HeraldStores

/// The large-history measurement of the durable store: 1,000,000
/// notifications over 10,000 users, then timings of the reads the gateway
/// makes. Skipped unless `HERALD_BIG=1`; run it in release mode:
///
///     HERALD_BIG=1 swift test -c release -Xswiftc -enable-testing \
///         --filter SQLiteStoreBenchmarkTests
///
/// `HERALD_BIG_DIR` picks where the database goes (default: the temp dir),
/// `HERALD_BIG_KEEP=1` keeps it and reuses it on the next run.
final class SQLiteStoreBenchmarkTests: XCTestCase {
    static let users = 10_000
    static let perUser = 100
    static let t0: Millis = 1_800_000_000_000

    func clock() -> UInt64 { DispatchTime.now().uptimeNanoseconds }

    /// Runs `body` for `n` random users; prints mean, p50 and p99 in µs.
    func bench(_ label: String, n: Int = 2000, _ body: (Int) throws -> Int) rethrows {
        var samples: [Double] = []
        samples.reserveCapacity(n)
        var items = 0
        for _ in 0..<n {
            let u = Int.random(in: 0..<Self.users)
            let t = clock()
            items += try body(u)
            samples.append(Double(clock() - t) / 1000)
        }
        samples.sort()
        let mean = samples.reduce(0, +) / Double(n)
        func pct(_ p: Double) -> Double { samples[min(n - 1, Int(Double(n) * p))] }
        print(String(format: "BENCH %-48@ mean %8.1f µs  p50 %8.1f µs  p99 %8.1f µs  (%.1f rows/call)",
                     label as NSString, mean, pct(0.5), pct(0.99), Double(items) / Double(n)))
    }

    func key(_ u: Int) -> UserKey { UserKey(app: "bench", user: "user-\(u)") }

    func testLargeHistory() throws {
        guard ProcessInfo.processInfo.environment["HERALD_BIG"] == "1" else { throw XCTSkip("set HERALD_BIG=1 to run") }
        let env = ProcessInfo.processInfo.environment
        let dir = env["HERALD_BIG_DIR"] ?? FileManager.default.temporaryDirectory.path
        let path = dir + "/herald-bench.db"
        let keep = env["HERALD_BIG_KEEP"] == "1"
        if !keep || !FileManager.default.fileExists(atPath: path) {
            for s in ["", "-wal", "-shm"] { try? FileManager.default.removeItem(atPath: path + s) }
            try load(path)
        }
        defer { if !keep { for s in ["", "-wal", "-shm"] { try? FileManager.default.removeItem(atPath: path + s) } } }

        let size = (try FileManager.default.attributesOfItem(atPath: path)[.size] as? Int) ?? 0
        print("BENCH database file: \(size / 1_048_576) MiB")

        var store = try SQLiteStore(path: path, durability: .full)
        // Warm the page cache the way a running gateway would be.
        try bench("warm-up history", n: 500) { try store.history(key($0), after: nil, limit: 50).count }

        try bench("feed(user)") { u in _ = try store.feed(key(u)); return 1 }
        try bench("history first page, limit 50") { try store.history(key($0), after: nil, limit: 50).count }
        var middle: [Int: HistoryKey] = [:]
        for u in 0..<Self.users where u % 7 == 0 {
            if let n = try store.history(key(u), after: nil, limit: 50).last { middle[u] = HistoryKey(n) }
        }
        try bench("history second page (after: key), limit 50") { u in
            let k = middle[u - u % 7] ?? HistoryKey(createdAt: .max, id: "")
            return try store.history(key(u - u % 7), after: k, limit: 50).count
        }
        try bench("history whole user (100), limit 1000 (counts)") { try store.history(key($0), after: nil, limit: 1000).count }
        try bench("changes after 0 (whole feed), limit 500") { try store.changes(key($0), after: 0, limit: 500).count }
        try bench("changes after head-10, limit 500 (resume)") { u in
            let head = try store.feed(key(u)).head
            return try store.changes(key(u), after: head - 10, limit: 500).count
        }
        try bench("changes after head (nothing new)") { u in
            let head = try store.feed(key(u)).head
            return try store.changes(key(u), after: head, limit: 500).count
        }
        try bench("notification by appNotificationId") { u in
            try store.notification(key(u), appNotificationId: "task-\(u)-42") == nil ? 0 : 1
        }
        try bench("expiring(until: now) with nothing due", n: 200) { _ in try store.due(.expiry, until: Self.t0, limit: 500).count }

        // Writes, as the engine makes them.
        let payload: JSONObject = ["title": "Bench", "body": .string(String(repeating: "b", count: 120))]
        var seqCheck: [Int: Int64] = [:]
        var next = 0
        func publishOne(_ u: Int) throws {
            next += 1
            let now = Self.t0 + 10_000_000 + Millis(next)
            let n = Notification(id: NotificationID.make(now: now), appNotificationId: "new-\(next)", userId: key(u).user,
                                 payload: payload, createdAt: now, updatedAt: now, expiresAt: now + 30 * 86_400_000)
            let r = try store.upsert(key(u), n, previous: nil, at: now)
            if let last = seqCheck[u] { XCTAssertGreaterThan(r.seq, last) }
            seqCheck[u] = r.seq
        }
        try bench("publish: 1 upsert + commit (durability full)", n: 300) { u in
            try store.begin(); try publishOne(u); try store.commit(); return 1
        }
        // One store per file at a time (SQLiteFileLock): the full one gives way while the normal one runs.
        store.close()
        let normal = try SQLiteStore(path: path, durability: .normal)
        try bench("publish: 1 upsert + commit (durability normal)", n: 300) { u in
            try normal.begin()
            next += 1
            let now = Self.t0 + 20_000_000 + Millis(next)
            let n = Notification(id: NotificationID.make(now: now), appNotificationId: "nrm-\(next)", userId: key(u).user,
                                 payload: payload, createdAt: now, updatedAt: now, expiresAt: now + 30 * 86_400_000)
            _ = try normal.upsert(key(u), n, previous: nil, at: now)
            try normal.commit()
            return 1
        }
        normal.close()
        store = try SQLiteStore(path: path, durability: .full)
        try bench("group commit: 100 upserts + commit (full)", n: 50) { u in
            try store.begin()
            for k in 0..<100 { try publishOne((u + k * 97) % Self.users) }
            try store.commit()
            return 100
        }
        let t = clock()
        try store.begin()
        let pruned = try store.pruneChanges(before: Self.t0 + 10_000) // the oldest 1%
        try store.commit()
        print(String(format: "BENCH pruneChanges of %d changes: %.1f ms", pruned, Double(clock() - t) / 1e6))
    }

    /// 1,000,000 notifications, round-robin over the users, in batches of
    /// 1,000 per transaction; createdAt advances 1 ms per notification.
    func load(_ path: String) throws {
        let store = try SQLiteStore(path: path, durability: .normal)
        let total = Self.users * Self.perUser
        let batch = 1000
        let t = clock()
        var k = 0
        while k < total {
            try store.begin()
            for _ in 0..<batch {
                let u = k % Self.users
                let now = Self.t0 + Millis(k)
                let n = Notification(id: NotificationID.make(now: now), appNotificationId: "task-\(u)-\(k / Self.users)",
                                     userId: key(u).user,
                                     payload: ["title": .string("Task \(k)"), "body": .string("Notification number \(k) for user \(u): something happened that needs attention."),
                                               "url": .string("https://example.com/tasks/\(k)")],
                                     groupName: k % 3 == 0 ? "tasks" : nil,
                                     targetPlatforms: k % 10 == 0 ? [.web, .ios] : nil,
                                     createdAt: now, updatedAt: now, expiresAt: now + 30 * 86_400_000)
                _ = try store.upsert(key(u), n, previous: nil, at: now)
                k += 1
            }
            try store.commit()
        }
        let secs = Double(clock() - t) / 1e9
        print(String(format: "BENCH load: %d notifications in %.1f s (%.0f/s, batches of %d, durability normal)",
                     total, secs, Double(total) / secs, batch))
        store.close()
    }

    /// Registrations and push holders: 100,000 users with a device each,
    /// one in ten holding a handle. Times opening the file (median of 5)
    /// and `pushDevices(of:)` for batches of 500 users, as a publishing
    /// batch asks: random users (about 50 holders each) and users none of
    /// whom holds one.
    func testPushHoldersAmongManyDevices() throws {
        guard ProcessInfo.processInfo.environment["HERALD_BIG"] == "1" else { throw XCTSkip("set HERALD_BIG=1 to run") }
        let dir = ProcessInfo.processInfo.environment["HERALD_BIG_DIR"] ?? FileManager.default.temporaryDirectory.path
        let path = dir + "/herald-bench-devices.db"
        func remove() { for s in ["", "-wal", "-shm"] { try? FileManager.default.removeItem(atPath: path + s) } }
        remove()
        defer { remove() }
        let users = 100_000
        func user(_ u: Int) -> UserKey { UserKey(app: "bench", user: "user-\(u)") }
        do {
            let store = try SQLiteStore(path: path, durability: .off)
            try store.begin()
            for u in 0..<users {
                let token = String(format: "%064x", u)
                try store.saveDevice(user(u), Device(deviceId: "d", platform: .ios, lastSeenAt: Self.t0,
                                                     push: u % 10 == 0 ? .apns(token: token, environment: .production) : nil))
            }
            try store.commit()
            store.close()
        }
        var opens: [Double] = []
        var store: SQLiteStore?
        for _ in 0..<5 {
            store?.close()
            store = nil
            let t = clock()
            store = try SQLiteStore(path: path, durability: .full)
            opens.append(Double(clock() - t) / 1_000_000)
        }
        print(String(format: "BENCH open with %d devices: median %.1f ms", users, opens.sorted()[2]))
        let s = try XCTUnwrap(store)
        try bench("pushDevices, 500 random users", n: 500) { _ in
            try s.pushDevices(of: (0..<500).map { _ in user(Int.random(in: 0..<users)) }).count
        }
        try bench("pushDevices, 500 users without a handle", n: 500) { _ in
            try s.pushDevices(of: (0..<500).map { _ in user(Int.random(in: 0..<users / 10) * 10 + 1) }).count
        }
    }
}
