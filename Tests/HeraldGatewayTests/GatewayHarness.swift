import HeraldPorts
import XCTest
import Synchronization
import HeraldCore
import HeraldCrypto
import HeraldStores
@testable import HeraldGateway
import HeraldTestSupport

/// A service loop that runs its jobs only when the test drains it, on the test's thread.
final class InlineLoop: LoopExecutor {
    typealias Job = @Sendable () -> Void
    private let jobs = Mutex<[Job]>([])
    private let captured = Mutex<[Job]?>(nil)

    func post(_ job: @escaping Job) {
        if captured.withLock({ c in c?.append(job); return c != nil }) { return }
        jobs.withLock { $0.append(job) }
    }

    /// What `body` posts, held back: the test posts it later (`post(contentsOf:)`),
    /// to let something else overtake it.
    func capture(_ body: () -> Void) -> [Job] {
        captured.withLock { $0 = [] }
        body()
        return captured.withLock { c in defer { c = nil }; return c! }
    }

    func post(contentsOf held: [Job]) { for j in held { post(j) } }

    /// Runs what is posted (and what that posts); answers how many ran.
    @discardableResult func drain() -> Int {
        var ran = 0
        while true {
            let batch = jobs.withLock { j in defer { j.removeAll() }; return j }
            if batch.isEmpty { return ran }
            for j in batch { j() }
            ran += batch.count
        }
    }
}

/// MemoryStore whose next commits fail, as a full disk or a lost database would.
final class FailingStore: NotificationStore {
    let inner: MemoryStore
    /// Say the data is shared with other partitions (as PostgreSQL's is):
    /// partitions given FailingStores over one `inner` share it, which the
    /// tests may do since they run every engine on their one thread.
    let isShared: Bool

    init(over inner: MemoryStore = MemoryStore(), shared: Bool = false) {
        self.inner = inner
        isShared = shared
    }
    var failCommits = 0
    /// Commits that throw a conflict (as a head another node moved would:
    /// `PostgresStore.claim`), nothing of them committed.
    var conflictCommits = 0
    /// Commits that happen, then throw as if the answer to COMMIT was lost.
    var loseCommitAnswers = 0
    /// Commits, upserts, prune calls and expiry sweeps (`expiring`) so far, readable from any thread.
    let commits = Atomic<Int>(0), upserts = Atomic<Int>(0), pruneCalls = Atomic<Int>(0), expiringCalls = Atomic<Int>(0)
    /// Planner statistics checks so far.
    let statisticsChecks = Atomic<Int>(0)
    /// Reads of device registrations, and expiry checks, that fail next, as
    /// with the store away.
    var failDeviceReads = 0, failExpiryChecks = 0
    /// Offers a reader connection (over the same MemoryStore, run by the test).
    var offersReader = false
    var epoch: String { inner.epoch }
    func begin() throws(StoreError) { try inner.begin() }
    /// Every lookup claimed so far, in order.
    var claimedLookups: [NotificationLookup] = []
    func claim(_ users: [UserKey], lookups: [NotificationLookup]) throws(StoreError) {
        claimedLookups += lookups
        try inner.claim(users, lookups: lookups)
    }
    func commit() throws(StoreError) {
        if failCommits > 0 {
            failCommits -= 1
            throw StoreError("disk full (test)")
        }
        if conflictCommits > 0 {
            conflictCommits -= 1
            throw StoreError("a feed moved (test)", conflict: true)
        }
        try inner.commit()
        commits.add(1, ordering: .relaxed)
        if loseCommitAnswers > 0 {
            loseCommitAnswers -= 1
            throw StoreError("connection lost after COMMIT (test)", outcomeUnknown: true)
        }
    }
    func rollback() { inner.rollback() }
    func feed(_ u: UserKey) throws(StoreError) -> FeedState { try inner.feed(u) }
    func notification(_ u: UserKey, id: String) throws(StoreError) -> HeraldCore.Notification? { try inner.notification(u, id: id) }
    func notification(_ u: UserKey, appNotificationId: String) throws(StoreError) -> HeraldCore.Notification? {
        try inner.notification(u, appNotificationId: appNotificationId)
    }
    func changes(_ u: UserKey, after: Int64, limit: Int) throws(StoreError) -> [ChangeRecord] { try inner.changes(u, after: after, limit: limit) }
    func history(_ u: UserKey, after: HistoryKey?, limit: Int) throws(StoreError) -> [HeraldCore.Notification] { try inner.history(u, after: after, limit: limit) }
    func counts(_ u: UserKey) throws(StoreError) -> [TargetingCounts] { try inner.counts(u) }
    func devices(_ u: UserKey) throws(StoreError) -> [Device] {
        try failIfDue(&failDeviceReads)
        return try inner.devices(u)
    }
    func upsert(_ u: UserKey, _ n: HeraldCore.Notification, previous: HeraldCore.Notification?, at: Millis) throws(StoreError) -> ChangeRecord {
        defer { upserts.add(1, ordering: .relaxed) }
        return try inner.upsert(u, n, previous: previous, at: at)
    }
    func delete(_ u: UserKey, _ n: HeraldCore.Notification, reason: DeleteReason, at: Millis) throws(StoreError) -> ChangeRecord {
        try inner.delete(u, n, reason: reason, at: at)
    }
    func due(_ deadline: Deadline, until: Millis, limit: Int, in partition: Partition) throws(StoreError) -> [(UserKey, HeraldCore.Notification)] {
        if deadline == .expiry { expiringCalls.add(1, ordering: .relaxed) }
        return try inner.due(deadline, until: until, limit: limit, in: partition)
    }
    func preferences(_ u: UserKey) throws(StoreError) -> Preferences { try inner.preferences(u) }
    func savePreferences(_ u: UserKey, _ p: Preferences, at: Millis) throws(StoreError) -> ChangeRecord {
        try inner.savePreferences(u, p, at: at)
    }
    func next(_ deadline: Deadline) throws(StoreError) -> Millis? {
        try failIfDue(&failExpiryChecks)
        return try inner.next(deadline)
    }
    /// Fails while `count` lasts, one failure a call, as a store away would.
    private func failIfDue(_ count: inout Int) throws(StoreError) {
        guard count > 0 else { return }
        count -= 1
        throw StoreError("database away (test)")
    }
    func refreshPlannerStatistics() throws(StoreError) -> [String] {
        statisticsChecks.add(1, ordering: .relaxed)
        return []
    }
    func pruneChanges(before: Millis, limit: Int) throws(StoreError) -> Pruned {
        pruneCalls.add(1, ordering: .relaxed)
        return try inner.pruneChanges(before: before, limit: limit)
    }
    func saveDevice(_ u: UserKey, _ d: Device) throws(StoreError) { try inner.saveDevice(u, d) }
    func deleteDevice(_ u: UserKey, id: String) throws(StoreError) -> Bool { try inner.deleteDevice(u, id: id) }
    func usersWithDevices(app: String) throws(StoreError) -> [(user: String, devices: [Device])] { try inner.usersWithDevices(app: app) }
    func pruneDevices(lastSeenBefore before: Millis) throws(StoreError) -> Int { try inner.pruneDevices(lastSeenBefore: before) }
    func enqueuePush(_ u: UserKey, deviceId: String, _ m: PushMessage, at: Millis, claimUntil: Millis?) throws(StoreError) -> PushJob? {
        try inner.enqueuePush(u, deviceId: deviceId, m, at: at, claimUntil: claimUntil)
    }
    func claimPushes(now: Millis, until: Millis, limit: Int) throws(StoreError) -> [PushJob] {
        try inner.claimPushes(now: now, until: until, limit: limit)
    }
    func finishPush(_ job: PushJob) throws(StoreError) { try inner.finishPush(job) }
    func retryPush(_ job: PushJob, at: Millis) throws(StoreError) { try inner.retryPush(job, at: at) }
    func spaceTaps(_ u: UserKey, deviceId: String, until: Millis) throws(StoreError) { try inner.spaceTaps(u, deviceId: deviceId, until: until) }
    func dropPushes(_ u: UserKey, deviceId: String) throws(StoreError) { try inner.dropPushes(u, deviceId: deviceId) }
    func pushHolder(app: String, key: String) throws(StoreError) -> (user: String, deviceId: String)? {
        try inner.pushHolder(app: app, key: key)
    }
    func pendingPushes() throws(StoreError) -> Int { try inner.pendingPushes() }
    func pendingPushes(_ u: UserKey) throws(StoreError) -> [String: Int] { try inner.pendingPushes(u) }
    func enqueueWebhook(app: String, url: String, eventId: String, body: [UInt8], at: Millis) throws(StoreError) {
        try inner.enqueueWebhook(app: app, url: url, eventId: eventId, body: body, at: at)
    }
    func claimWebhooks(app: String, url: String, now: Millis, until: Millis, limit: Int) throws(StoreError) -> [WebhookJob] {
        try inner.claimWebhooks(app: app, url: url, now: now, until: until, limit: limit)
    }
    func finishWebhook(_ job: WebhookJob) throws(StoreError) { try inner.finishWebhook(job) }
    func retryWebhook(_ job: WebhookJob, at: Millis, attempted: Bool) throws(StoreError) {
        try inner.retryWebhook(job, at: at, attempted: attempted)
    }
    func dropWebhooks(committedBefore before: Millis, limit: Int) throws(StoreError) -> Int {
        try inner.dropWebhooks(committedBefore: before, limit: limit)
    }
    func pendingWebhooks() throws(StoreError) -> Int { try inner.pendingWebhooks() }
    func pendingWebhooks(app: String, url: String, upTo limit: Int) throws(StoreError) -> Int {
        try inner.pendingWebhooks(app: app, url: url, upTo: limit)
    }
    func sharedToken(_ name: String) throws(StoreError) -> SharedToken? { try inner.sharedToken(name) }
    func replaceSharedToken(_ name: String, with t: SharedToken, replacing: Millis?) throws(StoreError) -> Bool {
        try inner.replaceSharedToken(name, with: t, replacing: replacing)
    }
    func makeReader() throws(StoreError) -> StoreReader? { offersReader ? MemoryReader(self) : nil }
    /// Set to make the engine sync commits on its sync thread.
    var commitSync: CommitSync?
}

/// A disk whose syncs finish when the test lets them: `sync()` blocks while closed.
final class GatedSync: CommitSync, @unchecked Sendable {  // `isOpen` is under `cond`
    private let cond = NSCondition()
    private var isOpen = true

    func close() { cond.withLock { isOpen = false } }
    func open() { cond.withLock { isOpen = true; cond.broadcast() } }

    func sync() throws(StoreError) {
        cond.lock()
        while !isOpen { cond.wait() }
        cond.unlock()
    }
}

/// A reader over a store the test also writes, on the test's thread: each
/// read sees the store as it is when the test runs it.
final class MemoryReader: StoreReader {
    let store: NotificationStore
    init(_ s: NotificationStore) { store = s }
    var epoch: String { store.epoch }
    func read<T>(_ body: (StoreReading) throws(StoreError) -> T) throws(StoreError) -> T { try body(store) }
    func feed(_ u: UserKey) throws(StoreError) -> FeedState { try store.feed(u) }
    func notification(_ u: UserKey, id: String) throws(StoreError) -> HeraldCore.Notification? { try store.notification(u, id: id) }
    func changes(_ u: UserKey, after: Int64, limit: Int) throws(StoreError) -> [ChangeRecord] { try store.changes(u, after: after, limit: limit) }
    func history(_ u: UserKey, after: HistoryKey?, limit: Int) throws(StoreError) -> [HeraldCore.Notification] { try store.history(u, after: after, limit: limit) }
    func counts(_ u: UserKey) throws(StoreError) -> [TargetingCounts] { try store.counts(u) }
    func devices(_ u: UserKey) throws(StoreError) -> [Device] { try store.devices(u) }
    func next(_ deadline: Deadline) throws(StoreError) -> Millis? { try store.next(deadline) }
    func preferences(_ u: UserKey) throws(StoreError) -> Preferences { try store.preferences(u) }
    func refreshPlannerStatistics() throws(StoreError) -> [String] { try store.refreshPlannerStatistics() }
}

/// An HTTP exchange as the gateway sees it, recorded.
final class RecordingResponder: HTTPResponder, @unchecked Sendable {  // test thread only
    var response: HTTPResponse?
    var streamStarted = false
    var streamHeaders: [(String, String)] = []
    var finished = false
    var unread: [UInt8] = []
    var received: [UInt8] = []
    private var closeHook: (() -> Void)?
    private var drainWaiter: (Int, () -> Void)?

    func respond(_ r: HTTPResponse) { if response == nil, !streamStarted { response = r } }
    func startStream(contentType: String, headers: [(String, String)]) { streamStarted = true; streamHeaders = headers }
    func send(_ bytes: [UInt8]) { if !finished { unread += bytes } }
    func finish() { finished = true }
    var queuedBytes: Int { unread.count }
    func onClose(_ f: @escaping () -> Void) { closeHook = f }
    func whenDrained(below bytes: Int, _ f: @escaping () -> Void) {
        if unread.count < bytes { f() } else { drainWaiter = (bytes, f) }
    }

    /// The client reads what was sent.
    func read() {
        received += unread
        unread = []
        if let (below, f) = drainWaiter, unread.count < below {
            drainWaiter = nil
            f()
        }
    }

    /// The client went away.
    func disconnect() { closeHook?() }

    var json: JSONObject? { response.flatMap { try? JSONParser.parse($0.body).objectValue } }

    /// Server-Sent Events received so far: (id, event, data).
    var events: [(id: Int64, name: String, data: JSONObject)] {
        String(decoding: received, as: UTF8.self).components(separatedBy: "\n\n").compactMap { block in
            var f: [String: String] = [:]
            for line in block.split(separator: "\n") where !line.hasPrefix(":") {
                let kv = line.split(separator: ":", maxSplits: 1)
                if kv.count == 2 { f[String(kv[0])] = String(kv[1].dropFirst()) }
            }
            guard let id = f["id"].flatMap({ Int64($0) }), let name = f["event"], let d = f["data"],
                  let o = try? JSONParser.parse(Array(d.utf8)).objectValue else { return nil }
            return (id, name, o)
        }
    }
}

/// The transport side of a WebSocket: the test reads frames when it wants to.
final class RecordingSocket: WebSocketOutput {
    var session: WebSocketSession!
    var frames: [JSONObject] = []
    /// Opcodes of the control frames read (ping 9, pong 10), in order.
    var controls: [UInt8] = []
    var hungUp = false

    func requestWrite() {}
    func hangUp() { hungUp = true }

    /// The client reads everything queued.
    func read() {
        guard session.hasPendingOutput else { return }
        var out: [UInt8] = []
        session.writePending(into: &out, limit: .max)
        var i = 0
        while i < out.count {
            XCTAssertEqual(out[i] & 0x80, 0x80, "a final frame")
            var len = Int(out[i + 1]), at = i + 2
            if len == 126 { len = Int(out[i + 2]) << 8 | Int(out[i + 3]); at = i + 4 }
            else if len == 127 { len = (0..<8).reduce(0) { $0 << 8 | Int(out[i + 2 + $1]) }; at = i + 10 }
            if out[i] == 0x81 {
                frames.append(try! JSONParser.parse(Array(out[at..<at + len])).objectValue!)
            } else {
                controls.append(out[i] & 0x0f)
            }
            i = at + len
        }
    }

    var types: [String] { frames.map { $0["type"]!.stringValue! } }
}

extension Gateway {
    /// The engine of a gateway with one partition (most tests').
    var soleEngine: Engine {
        precondition(partitions.count == 1, "this gateway has \(partitions.count) partitions")
        return partitions[0]
    }
}

/// One gateway in-process: one shard on an inline loop, the engine run on
/// the test's thread, a manual clock. Nothing runs until `settle()`.
final class Harness {
    static let app = AppConfig(id: "app.test", serverKey: "sk", tokenSecret: "ts")
    let clock = ManualClock()
    let loop = InlineLoop()
    let gateway: Gateway
    let shard: Shard

    /// `bus`: another node's harness may share `store` and the bus's hub.
    /// `partitions`: more memory stores, each a partition of its own beside `store`'s.
    convenience init(store: NotificationStore = MemoryStore(), partitions: Int = 1, bus: Bus? = nil, limits: GatewayLimits = GatewayLimits(),
                     apps: [AppConfig] = [Harness.app], push: PushTransport? = nil) {
        self.init(stores: [store] + (1..<partitions).map { _ in MemoryStore() }, bus: bus, limits: limits, apps: apps, push: push)
    }

    /// One partition per store of `stores`.
    init(stores: [NotificationStore], bus: Bus? = nil, limits: GatewayLimits = GatewayLimits(),
         apps: [AppConfig] = [Harness.app], push: PushTransport? = nil) {
        gateway = try! Gateway(config: GatewayConfig(apps: apps, limits: limits), partitions: stores, bus: bus, push: push, clock: clock)
        shard = gateway.makeShards([loop])[0]
        shard.thread.claim()
        gateway.startBus()
    }

    /// Runs engine batches, reads and loop jobs until none has anything left.
    func settle() {
        repeat {
            for e in gateway.partitions { e.runQueued() }
            gateway.reads.runQueued()
        } while loop.drain() > 0 || gateway.metrics.engineQueued > 0
    }

    /// The engines' queues run once, the loop not at all.
    func runEngine() { for e in gateway.partitions { e.runQueued() } }

    func token(_ user: String, ttl: Int64 = 3600, app: AppConfig = Harness.app, signedWith s: TokenSecret? = nil) -> String {
        let now = clock.now() / 1000
        let s = s ?? app.signingSecret
        return DeviceToken.sign(DeviceClaims(app: app.id, user: user, device: nil, issuedAt: now, expiresAt: now + ttl),
                                secret: s.secret, kid: s.kid)
    }

    @discardableResult
    func request(_ method: String, _ path: String, token: String? = nil, device: String? = nil, query: [(String, String)] = [],
                 body: JSON? = nil, headers: [String: String] = [:]) -> RecordingResponder {
        var h: [String: String] = ["authorization": "Bearer " + (token ?? Self.app.serverKeys[0])]
        if let device { h["herald-device"] = device }
        h.merge(headers) { $1 }
        let r = RecordingResponder()
        gateway.handle(HTTPRequest(method: method, path: path, query: query, headers: h, body: body?.encoded ?? []),
                       shard: shard, responder: r)
        return r
    }

    /// Publishes without settling; the answer comes once the engine ran.
    @discardableResult func publish(_ user: String, _ anid: String, payloadBytes: Int = 10) -> RecordingResponder {
        request("POST", "/v1/apps/\(Self.app.id)/users/\(user)/notifications",
                body: ["appNotificationId": .string(anid), "payload": ["body": .string(String(repeating: "x", count: payloadBytes))]])
    }

    func publishSettled(_ user: String, count: Int, payloadBytes: Int = 10) {
        for i in 0..<count { publish(user, "n\(i)", payloadBytes: payloadBytes) }
        settle()
    }

    func webSocket(origin: String? = nil) -> RecordingSocket {
        let s = RecordingSocket()
        s.session = gateway.openWebSocket(shard: shard, transport: s, origin: origin)
        return s
    }

    func hello(_ s: RecordingSocket, user: String, device: String = "d1", cursor: Int64? = nil, ttl: Int64 = 3600,
               app: AppConfig = Harness.app, token: String? = nil) {
        var o: JSONObject = ["type": "hello", "token": .string(token ?? self.token(user, ttl: ttl, app: app)), "deviceId": .string(device)]
        if let cursor { o["cursor"] = .int(cursor) }
        s.session.receive(.text(JSON.object(o).encoded))
    }
}

extension JSONObject {
    func int(_ k: String) -> Int64? { self[k]?.int64Value }
}

/// Seqs of the changes in `change`/`changes` frames, in order.
func changeSeqs(_ frames: [JSONObject]) -> [Int64] {
    frames.flatMap { f -> [Int64] in
        switch f["type"]?.stringValue {
        case "change": return [f["change"]!.objectValue!.int("seq")!]
        case "changes": return f["changes"]!.arrayValue!.map { $0.objectValue!.int("seq")! }
        default: return []
        }
    }
}
