import HeraldCore

/// The domain operations, run on the engine thread inside a command.
extension Engine {
    /// Upsert by appNotificationId (SPEC section 3).
    func publish(_ user: UserKey, _ draft: NotificationDraft, now: Millis) throws(StoreError)
        -> Result<(Notification, seq: Int64, created: Bool), HeraldError>
    {
        let existing = try store.notification(user, appNotificationId: draft.appNotificationId)
        let n: Notification
        do { n = try draft.notification(replacing: existing, userId: user.user, now: now) } catch { return .failure(error) }
        let r = try store.upsert(user, n, previous: existing, at: now)
        publish(user, r)
        metrics.publishes.add(1, ordering: .relaxed)
        return .success((n, r.seq, existing == nil))
    }

    /// The notification `id` if `viewer` may see it.
    func visible(_ user: UserKey, id: String, viewer: Viewer) throws(StoreError) -> Notification? {
        guard let n = try store.notification(user, id: id), n.targeting.admits(viewer) else { return nil }
        return n
    }

    func updateState(_ user: UserKey, id: String, _ u: StateUpdate, viewer: Viewer, now: Millis) throws(StoreError)
        -> Result<(Notification, seq: Int64), HeraldError>
    {
        guard let n = try visible(user, id: id, viewer: viewer) else { return .failure(.notFound) }
        if let v = u.ifVersion, v != n.version {
            return .failure(HeraldError(.preconditionFailed, "version is \(n.version), not \(v)"))
        }
        guard let m = u.applied(to: n, now: now) else { return .success((n, try store.feed(user).head)) }
        let r = try store.upsert(user, m, previous: n, at: now)
        publish(user, r)
        return .success((m, r.seq))
    }

    func delete(_ user: UserKey, id: String, viewer: Viewer, now: Millis) throws(StoreError) -> Result<Int64, HeraldError> {
        guard let n = try visible(user, id: id, viewer: viewer) else { return .failure(.notFound) }
        let r = try store.delete(user, n, reason: .deleted, at: now)
        publish(user, r)
        return .success(r.seq)
    }

    /// Every live notification `viewer` may see, in history order.
    func allVisible(_ user: UserKey, viewer: Viewer) throws(StoreError) -> [Notification] {
        var out: [Notification] = []
        var after: HistoryKey? = nil
        while true {
            let page = try store.history(user, after: after, limit: 1000)
            out.append(contentsOf: page.lazy.filter { $0.targeting.admits(viewer) })
            guard page.count == 1000, let last = page.last else { return out }
            after = HistoryKey(last)
        }
    }

    func readAll(_ user: UserKey, viewer: Viewer, now: Millis) throws(StoreError) -> (updated: Int, seq: Int64) {
        var updated = 0
        for n in try allVisible(user, viewer: viewer) where n.readState == .unread {
            let m = StateUpdate(readState: .read).applied(to: n, now: now)!
            publish(user, try store.upsert(user, m, previous: n, at: now))
            updated += 1
        }
        return (updated, try store.feed(user).head)
    }

    struct Counts { var unread = 0, noInteraction = 0, total = 0 }

    func counts(_ user: UserKey, viewer: Viewer) throws(StoreError) -> Counts {
        var c = Counts()
        for n in try allVisible(user, viewer: viewer) {
            c.total += 1
            if n.readState == .unread { c.unread += 1 }
            if n.userActionState == .noInteraction { c.noInteraction += 1 }
        }
        return c
    }

    struct HistoryFilter {
        var readState: ReadState?
        var userActionState: UserActionState?
        func admits(_ n: Notification) -> Bool {
            (readState.map { $0 == n.readState } ?? true) && (userActionState.map { $0 == n.userActionState } ?? true)
        }
    }

    /// One history page and the token of the next, if any.
    func history(_ user: UserKey, viewer: Viewer, filter: HistoryFilter, before: HistoryKey?, limit: Int) throws(StoreError)
        -> (notifications: [Notification], next: String?)
    {
        var out: [Notification] = []
        var after = before
        var more = false
        scan: while true {
            let page = try store.history(user, after: after, limit: max(limit, 100))
            for n in page where n.targeting.admits(viewer) && filter.admits(n) {
                if out.count == limit { more = true; break scan }
                out.append(n)
            }
            guard page.count == max(limit, 100), let last = page.last else { break }
            after = HistoryKey(last)
        }
        return (out, more ? out.last.map { PageToken.encode(HistoryKey($0)) } : nil)
    }

    /// What a device must receive to catch up from `position`: the changes
    /// it may see after its cursor, or a reset.
    enum CatchUp {
        /// Visible changes after the cursor (encoded), the position read up
        /// to, and whether `limit` cut them short.
        case changes([(seq: Int64, bytes: [UInt8])], reached: Int64, more: Bool)
        /// The cursor is unusable: the newest notifications the device may
        /// see as of `head`, and the page token of the rest (nil: all given).
        case reset([Notification], next: String?, head: Int64)
    }

    /// Catch-up for every transport. `limit` bounds the changes; `resetLimit`
    /// bounds a reset's notifications (nil: all of them, as WebSockets send).
    func catchUp(_ user: UserKey, viewer: Viewer, from position: FeedPosition, limit: Int = .max,
                 resetLimit: Int? = nil) throws(StoreError) -> CatchUp {
        let feed = try store.feed(user)
        guard let cursor = position.resumable(in: feed, epoch: viewer.epoch(store: store.epoch)) else {
            guard let resetLimit else { return .reset(try allVisible(user, viewer: viewer), next: nil, head: feed.head) }
            let page = try history(user, viewer: viewer, filter: HistoryFilter(), before: nil, limit: resetLimit)
            return .reset(page.notifications, next: page.next, head: feed.head)
        }
        var out: [(seq: Int64, bytes: [UInt8])] = []
        var reached = cursor
        while reached < feed.head {
            let page = try store.changes(user, after: reached, limit: 1000)
            guard !page.isEmpty else { break }
            for r in page {
                if let b = r.bytes(for: viewer) {
                    if out.count == limit { return .changes(out, reached: reached, more: true) }
                    out.append((r.seq, b))
                }
                reached = r.seq
            }
        }
        return .changes(out, reached: feed.head, more: false)
    }

    /// The viewer of a named device, registering it (and applying `registration`) if asked.
    func viewer(_ user: UserKey, deviceId: String?, registration: DeviceRegistration? = nil, now: Millis) throws(StoreError) -> Viewer {
        guard let deviceId else { return .unnamed }
        let existing = try store.device(user, id: deviceId)
        var device = existing ?? Device(deviceId: deviceId, lastSeenAt: now)
        if let registration { device = registration.applied(to: existing, deviceId: deviceId, now: now) }
        if existing == nil || existing != device {
            try store.saveDevice(user, device)
            if let existing, existing.viewGeneration != device.viewGeneration {
                let v = Viewer(userId: user.user, device: device)
                afterCommit { [shards] in for s in shards { s.post { s.viewerChanged(user, deviceId: deviceId, viewer: v) } } }
            }
        }
        markSeen(user, device: deviceId, at: now)
        return Viewer(userId: user.user, device: device)
    }

    func deviceJSON(_ user: UserKey, _ d: Device, now: Millis) -> JSON {
        let p = presence[user]?[d.deviceId]
        let transport = p?.transport(now: now)
        return ["deviceId": .string(d.deviceId), "platform": .string(d.platform.rawValue),
                "tags": .array(d.allTags(userId: user.user).map(JSON.string)),
                "connected": .bool(transport != nil), "transport": transport.json,
                "lastSeenAt": .string(RFC3339.format(max(d.lastSeenAt, p?.lastSeenAt ?? 0)))]
    }

    func deleteDevice(_ user: UserKey, deviceId: String) throws(StoreError) -> Bool {
        guard try store.deleteDevice(user, id: deviceId) else { return false }
        afterCommit { [shards] in for s in shards { s.post { s.deviceDeleted(user, deviceId: deviceId) } } }
        return true
    }

    func connectionOpened(_ user: UserKey, deviceId: String?, transport: Metrics.Transport, now: Millis) {
        guard let deviceId else { return }
        var p = presence[user, default: [:]][deviceId, default: DevicePresence()]
        switch transport {
        case .websocket: p.websocket += 1
        case .sse: p.sse += 1
        case .poll: p.heldPolls += 1; p.lastPollAt = now
        }
        p.lastSeenAt = now
        presence[user, default: [:]][deviceId] = p
    }

    /// A plain poll: the device shows as `poll` for 60 s.
    func markPolled(_ user: UserKey, deviceId: String?, now: Millis) {
        guard let deviceId else { return }
        presence[user, default: [:]][deviceId, default: DevicePresence()].lastPollAt = now
        markSeen(user, device: deviceId, at: now)
    }

    func connectionClosed(_ user: UserKey, deviceId: String?, transport: Metrics.Transport, now: Millis) {
        guard let deviceId, var p = presence[user]?[deviceId] else { return }
        switch transport {
        case .websocket: p.websocket -= 1
        case .sse: p.sse -= 1
        case .poll: p.heldPolls -= 1; p.lastPollAt = now
        }
        p.lastSeenAt = now
        presence[user]![deviceId] = p
        seenDirty[user, default: []].insert(deviceId)
    }
}
