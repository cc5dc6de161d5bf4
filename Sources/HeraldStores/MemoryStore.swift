import HeraldCore

/// The in-memory store: for tests and trials. History is lost on restart,
/// so each instance has a fresh epoch and resuming clients get a reset.
public final class MemoryStore: NotificationStore {
    public let epoch: String

    struct UserData {
        var feed = FeedState()
        var byId: [String: Notification] = [:]
        var idByAppId: [String: String] = [:]
        /// History order (newest first).
        var order: [HistoryKey] = []
        /// Ascending seq.
        var changes: [ChangeRecord] = []
        var preferences = Preferences.unsaved

        /// Appends a change with the next seq.
        mutating func append(_ op: Change.Op, before: Presence?, after: Presence?, at: Millis) -> ChangeRecord {
            feed.head += 1
            let r = ChangeRecord(change: Change(seq: feed.head, op: op), before: before, after: after, at: at)
            changes.append(r)
            return r
        }

        /// Undoes the last `append`.
        mutating func removeLastChange() {
            changes.removeLast()
            feed.head -= 1
        }
    }

    private var users: [UserKey: UserData] = [:]
    /// Live notification counts, kept by `write` (see `StoreReading.counts`).
    private var countsByUser: [UserKey: [TargetingKey: TargetingCounts]] = [:]
    private var devicesByUser: [UserKey: [Device]] = [:]
    /// Per deadline, the notifications it falls for, earliest first.
    private var dueHeaps: [Deadline: Heap<DueEntry>] = [.expiry: Heap(), .wake: Heap()]
    private var pushes = OutboxRows<PushJob>()
    private var webhooks = OutboxRows<WebhookJob>()
    /// Per device, when its next tap may be sent (`spaceTaps`).
    private var tapsNotBefore: [DeviceKey: Millis] = [:]
    private var sharedTokens: [String: SharedToken] = [:]

    struct DeviceKey: Hashable {
        let user: UserKey
        let deviceId: String
    }

    /// An outbox, the push one or the webhook one, by id (ids ascend in
    /// the order recorded): each row due at a time, held until its claim
    /// runs out.
    struct OutboxRows<Job: OutboxJob> {
        struct Row {
            var job: Job
            var dueAt: Millis
            var claimedUntil: Millis = 0
        }
        var rows: [Int64: Row] = [:]
        var lastId: Int64 = 0
    }

    struct DueEntry: Comparable {
        let at: Millis
        let user: UserKey
        let id: String
        static func < (a: Self, b: Self) -> Bool { a.at < b.at }
        static func == (a: Self, b: Self) -> Bool { a.at == b.at && a.user == b.user && a.id == b.id }
    }

    /// Inverses of the open transaction's writes, newest last. Writes
    /// mutate in place (no copy-on-write of a user's arrays), and a rollback
    /// runs the inverses backwards.
    private var inTransaction = false
    private var undo: [(MemoryStore) -> Void] = []

    public init() { epoch = "m-" + Random.hex(8) }

    public func begin() throws(StoreError) { inTransaction = true }

    public func commit() throws(StoreError) {
        inTransaction = false
        undo.removeAll(keepingCapacity: true)
    }

    public func rollback() {
        for u in undo.reversed() { u(self) }
        inTransaction = false
        undo.removeAll()
        // Due entries of undone writes are stale and skipped when popped;
        // re-add the surviving notifications' entries in case one was popped.
        for (u, d) in users { for n in d.byId.values { noteDue(u, n) } }
    }

    private func noteDue(_ user: UserKey, _ n: Notification) {
        for d in Deadline.allCases { if let at = n.at(d) { dueHeaps[d]!.push(DueEntry(at: at, user: user, id: n.id)) } }
    }

    private func onRollback(_ f: @escaping (MemoryStore) -> Void) {
        if inTransaction { undo.append(f) }
    }

    public func feed(_ user: UserKey) throws(StoreError) -> FeedState { users[user]?.feed ?? FeedState() }

    public func notification(_ user: UserKey, id: String) throws(StoreError) -> Notification? { users[user]?.byId[id] }

    public func notification(_ user: UserKey, appNotificationId: String) throws(StoreError) -> Notification? {
        guard let d = users[user], let id = d.idByAppId[appNotificationId] else { return nil }
        return d.byId[id]
    }

    /// Puts `n` in place of whatever had its id (nil: removes it).
    private static func place(_ d: inout UserData, id: String, _ n: Notification?, old: Notification?) {
        if let old {
            d.idByAppId.removeValue(forKey: old.appNotificationId)
            if n == nil {
                let key = HistoryKey(old)
                let i = d.order.insertionIndex(of: key)
                if i < d.order.count, d.order[i] == key { d.order.remove(at: i) }
            }
        }
        if let n {
            if old == nil {
                let key = HistoryKey(n)
                d.order.insert(key, at: d.order.insertionIndex(of: key))
            }
            d.idByAppId[n.appNotificationId] = n.id
        }
        d.byId[id] = n
    }

    /// Writes `n` (or removes the notification) and appends its change.
    private func write(_ user: UserKey, id: String, _ n: Notification?, _ op: Change.Op, before: Presence?, after: Presence?,
                       at: Millis) -> ChangeRecord {
        let old = users[user]?.byId[id]
        let r = { (d: inout UserData) -> ChangeRecord in
            Self.place(&d, id: id, n, old: old)
            return d.append(op, before: before, after: after, at: at)
        }(&users[user, default: UserData()])
        if let n { noteDue(user, n) }
        // From what was stored, not from the caller's `before`: the counts
        // stay those of the live notifications whatever the caller passes.
        let deltas = CountDelta.replacing(old.map(Counted.init), by: n.map(Counted.init))
        count(user, deltas)
        onRollback { s in
            s.count(user, deltas.map(\.negated))
            s.users[user]!.removeLastChange()
            Self.place(&s.users[user]!, id: id, old, old: n)
        }
        return r
    }

    private func count(_ user: UserKey, _ deltas: [CountDelta]) {
        for d in deltas {
            let total = { (c: inout TargetingCounts) -> Int in
                c.unread += d.unread
                c.unseen += d.unseen
                c.noInteraction += d.noInteraction
                c.total += d.total
                return c.total
            }(&countsByUser[user, default: [:]][d.key, default: TargetingCounts(targeting: d.targeting)])
            if total == 0 {
                countsByUser[user]![d.key] = nil
                if countsByUser[user]!.isEmpty { countsByUser[user] = nil }
            }
        }
    }

    public func upsert(_ user: UserKey, _ n: Notification, previous: Notification?, at: Millis) throws(StoreError) -> ChangeRecord {
        write(user, id: n.id, n, .upsert(n), before: previous.map(Presence.init), after: Presence(n), at: at)
    }

    public func delete(_ user: UserKey, _ n: Notification, reason: DeleteReason, at: Millis) throws(StoreError) -> ChangeRecord {
        let op = Change.Op.delete(id: n.id, appNotificationId: n.appNotificationId, reason: reason)
        return write(user, id: n.id, nil, op, before: Presence(n), after: nil, at: at)
    }

    public func preferences(_ user: UserKey) throws(StoreError) -> Preferences { users[user]?.preferences ?? .unsaved }

    public func savePreferences(_ user: UserKey, _ p: Preferences, at: Millis) throws(StoreError) -> ChangeRecord {
        let old = users[user]?.preferences ?? .unsaved
        let r = { (d: inout UserData) -> ChangeRecord in
            d.preferences = p.with(critical: [])
            return d.append(.preferences(p), before: nil, after: nil, at: at)
        }(&users[user, default: UserData()])
        onRollback { s in
            s.users[user]!.removeLastChange()
            s.users[user]!.preferences = old
        }
        return r
    }

    public func changes(_ user: UserKey, after: Int64, limit: Int) throws(StoreError) -> [ChangeRecord] {
        guard let d = users[user] else { return [] }
        // First index with seq > after.
        var lo = 0, hi = d.changes.count
        while lo < hi {
            let mid = (lo + hi) / 2
            if d.changes[mid].seq <= after { lo = mid + 1 } else { hi = mid }
        }
        return Array(d.changes[lo..<min(d.changes.count, lo + limit)])
    }

    public func history(_ user: UserKey, after: HistoryKey?, limit: Int) throws(StoreError) -> [Notification] {
        guard let d = users[user] else { return [] }
        var start = 0
        if let after {
            start = d.order.insertionIndex(of: after)
            if start < d.order.count, d.order[start] == after { start += 1 }
        }
        return d.order[start..<min(d.order.count, start + limit)].compactMap { d.byId[$0.id] }
    }

    public func counts(_ user: UserKey) throws(StoreError) -> [TargetingCounts] {
        countsByUser[user].map { Array($0.values) } ?? []
    }

    /// The heap's top, which may be stale (replaced or deleted since): early, as allowed.
    public func next(_ deadline: Deadline) throws(StoreError) -> Millis? { dueHeaps[deadline]!.peek?.at }

    public func due(_ deadline: Deadline, until: Millis, limit: Int, in partition: Partition) throws(StoreError) -> [(UserKey, Notification)] {
        var out: [(UserKey, Notification)] = []
        var keep: [DueEntry] = []
        while out.count < limit, let top = dueHeaps[deadline]!.peek, top.at <= until {
            let e = dueHeaps[deadline]!.pop()!
            // Skip entries made stale by a replace or delete.
            guard let n = users[e.user]?.byId[e.id], n.at(deadline) == e.at,
                  !keep.contains(where: { $0.user == e.user && $0.id == e.id }) else { continue }
            keep.append(e)
            if partition.owns(e.user) { out.append((e.user, n)) }
        }
        // The caller changes them; until then they stay due (and other partitions' stay for them).
        for e in keep { dueHeaps[deadline]!.push(e) }
        return out
    }

    public func pruneChanges(before: Millis, limit: Int) throws(StoreError) -> Pruned {
        let limit = max(limit, 1)
        var pruned = 0
        for k in Array(users.keys) {
            guard let first = users[k]!.changes.first, first.at < before else { continue }
            guard pruned < limit else { return Pruned(changes: pruned, more: true) }
            let due = users[k]!.changes.prefix { $0.at < before }.count
            let n = min(due, limit - pruned)
            let removed = Array(users[k]!.changes.prefix(n))
            let floor = users[k]!.feed.floor
            users[k]!.feed.floor = removed[n - 1].seq
            users[k]!.changes.removeFirst(n)
            pruned += n
            onRollback { s in
                s.users[k]!.changes.insert(contentsOf: removed, at: 0)
                s.users[k]!.feed.floor = floor
            }
            if n < due { return Pruned(changes: pruned, more: true) }
        }
        return Pruned(changes: pruned, more: false)
    }

    public func devices(_ user: UserKey) throws(StoreError) -> [Device] { devicesByUser[user] ?? [] }

    /// Only the owner's thread may read: the dictionaries are not shared.
    public func makeReader() throws(StoreError) -> StoreReader? { nil }

    private func setDevices(_ user: UserKey, _ list: [Device]?) {
        let old = devicesByUser[user]
        devicesByUser[user] = list
        onRollback { s in s.devicesByUser[user] = old }
    }

    public func saveDevice(_ user: UserKey, _ device: Device) throws(StoreError) {
        var list = devicesByUser[user] ?? []
        if let i = list.firstIndex(where: { $0.deviceId == device.deviceId }) { list[i] = device } else { list.append(device) }
        setDevices(user, list)
    }

    public func deleteDevice(_ user: UserKey, id: String) throws(StoreError) -> Bool {
        guard var list = devicesByUser[user], let i = list.firstIndex(where: { $0.deviceId == id }) else { return false }
        try dropPushes(user, deviceId: id)
        list.remove(at: i)
        setDevices(user, list.isEmpty ? nil : list)
        return true
    }

    public func usersWithDevices(app: String) throws(StoreError) -> [(user: String, devices: [Device])] {
        devicesByUser.filter { $0.key.app == app }.map { (user: $0.key.user, devices: $0.value) }
    }

    public func pruneDevices(lastSeenBefore before: Millis) throws(StoreError) -> Int {
        var n = 0
        for (k, list) in devicesByUser {
            let kept = list.filter { $0.lastSeenAt >= before }
            guard kept.count != list.count else { continue }
            n += list.count - kept.count
            setDevices(k, kept.isEmpty ? nil : kept)
        }
        for (k, at) in tapsNotBefore where at < before { setTapsNotBefore(k, nil) }
        return n
    }
}

extension MemoryStore {
    private func set<J>(_ box: ReferenceWritableKeyPath<MemoryStore, OutboxRows<J>>, _ id: Int64, _ row: OutboxRows<J>.Row?) {
        let old = self[keyPath: box].rows[id]
        self[keyPath: box].rows[id] = row
        onRollback { s in s[keyPath: box].rows[id] = old }
    }

    private func setPush(_ id: Int64, _ row: OutboxRows<PushJob>.Row?) { set(\.pushes, id, row) }

    /// Up to `limit` rows of `box` due by `now`, unheld and `matching`, oldest due first, now held until `until`.
    private func claim<J>(_ box: ReferenceWritableKeyPath<MemoryStore, OutboxRows<J>>, now: Millis, until: Millis, limit: Int,
                          matching: (J) -> Bool = { _ in true }) -> [J] {
        let due = self[keyPath: box].rows.values.filter { $0.dueAt <= now && $0.claimedUntil <= now && matching($0.job) }
            .sorted { ($0.dueAt, $0.job.id) < ($1.dueAt, $1.job.id) }.prefix(limit)
        for var row in due {
            row.claimedUntil = until
            set(box, row.job.id, row)
        }
        return due.map(\.job)
    }

    private func retry<J>(_ box: ReferenceWritableKeyPath<MemoryStore, OutboxRows<J>>, _ job: J, at: Millis, attempted: Bool = true) {
        guard var row = self[keyPath: box].rows[job.id] else { return }
        row.job.attempts = job.attempts + (attempted ? 1 : 0)
        row.dueAt = at
        row.claimedUntil = 0
        set(box, job.id, row)
    }

    @discardableResult
    public func enqueuePush(_ user: UserKey, deviceId: String, _ message: PushMessage, at: Millis,
                            claimUntil: Millis?) throws(StoreError) -> PushJob? {
        if message.kind == .tap, var row = pushes.rows.values.first(where: {
            $0.job.user == user && $0.job.deviceId == deviceId && $0.job.message.kind == .tap
        }) {
            row.job.message = message
            row.job.generation += 1
            setPush(row.job.id, row)
            return nil
        }
        pushes.lastId += 1
        let job = PushJob(id: pushes.lastId, user: user, deviceId: deviceId, message: message, committedAt: at)
        let due = message.kind == .tap ? max(at, tapsNotBefore[DeviceKey(user: user, deviceId: deviceId)] ?? at) : at
        let claimed = due == at ? claimUntil : nil
        setPush(job.id, .init(job: job, dueAt: due, claimedUntil: claimed ?? 0))
        return claimed == nil ? nil : job
    }

    private func setTapsNotBefore(_ k: DeviceKey, _ at: Millis?) {
        let old = tapsNotBefore[k]
        tapsNotBefore[k] = at
        onRollback { s in s.tapsNotBefore[k] = old }
    }

    public func spaceTaps(_ user: UserKey, deviceId: String, until: Millis) throws(StoreError) {
        setTapsNotBefore(DeviceKey(user: user, deviceId: deviceId), until)
        for var row in pushes.rows.values where row.job.user == user && row.job.deviceId == deviceId && row.job.message.kind == .tap {
            row.dueAt = max(row.dueAt, until)
            setPush(row.job.id, row)
        }
    }

    public func claimPushes(now: Millis, until: Millis, limit: Int) throws(StoreError) -> [PushJob] {
        claim(\.pushes, now: now, until: until, limit: limit)
    }

    public func finishPush(_ job: PushJob) throws(StoreError) {
        guard var row = pushes.rows[job.id] else { return }
        guard row.job.generation != job.generation else { return setPush(job.id, nil) }
        row.claimedUntil = 0
        row.dueAt = min(row.dueAt, job.committedAt)
        setPush(job.id, row)
    }

    public func retryPush(_ job: PushJob, at: Millis) throws(StoreError) { retry(\.pushes, job, at: at) }

    public func dropPushes(_ user: UserKey, deviceId: String) throws(StoreError) {
        for row in pushes.rows.values where row.job.user == user && row.job.deviceId == deviceId { setPush(row.job.id, nil) }
    }

    public func pushHolder(app: String, key: String) throws(StoreError) -> (user: String, deviceId: String)? {
        for (u, list) in devicesByUser where u.app == app {
            if let d = list.first(where: { $0.push?.key == key }) { return (u.user, d.deviceId) }
        }
        return nil
    }

    public func pendingPushes() throws(StoreError) -> Int { pushes.rows.count }

    public func pendingPushes(_ user: UserKey) throws(StoreError) -> [String: Int] {
        var out: [String: Int] = [:]
        for row in pushes.rows.values where row.job.user == user { out[row.job.deviceId, default: 0] += 1 }
        return out
    }

    public func enqueueWebhook(app: String, url: String, eventId: String, body: [UInt8], at: Millis) throws(StoreError) {
        webhooks.lastId += 1
        let job = WebhookJob(id: webhooks.lastId, app: app, url: url, eventId: eventId, body: body, committedAt: at)
        set(\.webhooks, job.id, .init(job: job, dueAt: at))
    }

    public func claimWebhooks(app: String, url: String, now: Millis, until: Millis, limit: Int) throws(StoreError) -> [WebhookJob] {
        claim(\.webhooks, now: now, until: until, limit: limit) { $0.app == app && $0.url == url }
    }

    public func finishWebhook(_ job: WebhookJob) throws(StoreError) { set(\.webhooks, job.id, nil) }

    public func retryWebhook(_ job: WebhookJob, at: Millis, attempted: Bool) throws(StoreError) {
        retry(\.webhooks, job, at: at, attempted: attempted)
    }

    public func dropWebhooks(committedBefore before: Millis, limit: Int) throws(StoreError) -> Int {
        let old = webhooks.rows.values.filter { $0.job.committedAt < before }.prefix(limit)
        for row in old { set(\.webhooks, row.job.id, nil) }
        return old.count
    }

    public func pendingWebhooks() throws(StoreError) -> Int { webhooks.rows.count }

    public func pendingWebhooks(app: String, url: String, upTo limit: Int) throws(StoreError) -> Int {
        webhooks.rows.values.lazy.filter { $0.job.app == app && $0.job.url == url }.prefix(limit).count
    }

    public func sharedToken(_ name: String) throws(StoreError) -> SharedToken? { sharedTokens[name] }

    public func replaceSharedToken(_ name: String, with token: SharedToken, replacing: Millis?) throws(StoreError) -> Bool {
        let old = sharedTokens[name]
        guard old?.issuedAt == replacing else { return false }
        sharedTokens[name] = token
        onRollback { s in s.sharedTokens[name] = old }
        return true
    }
}

extension Array where Element: Comparable {
    /// The first index whose element is not less than `e` (self is sorted).
    func insertionIndex(of e: Element) -> Int {
        var lo = 0, hi = count
        while lo < hi {
            let mid = (lo + hi) / 2
            if self[mid] < e { lo = mid + 1 } else { hi = mid }
        }
        return lo
    }
}

