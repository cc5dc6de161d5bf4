import HeraldCore

/// The write operations, run on the engine thread inside a batch. Their
/// writes go through the batch's `FeedTransaction`, which records what
/// each leaves to do after the commit.
extension Engine {
    /// What a publish did to one user's feed.
    enum Published {
        case saved(WriteAnswer, created: Bool)
        /// The user keeps the draft's group out of the inbox (SPEC section
        /// 12): nothing was created or changed.
        case suppressed
    }

    /// Creates or replaces the notification with the draft's
    /// appNotificationId (SPEC section 3), unless the user's preferences
    /// keep its group out of the inbox.
    func upsertNotification(_ user: UserKey, _ draft: NotificationDraft, now: Millis) throws(StoreError)
        -> Result<Published, HeraldError>
    {
        let existing = try reads.notification(user, appNotificationId: draft.appNotificationId)
        let n: Notification
        do { n = try draft.notification(replacing: existing, userId: user.user, now: now) } catch { return .failure(error) }
        guard try push.preferences(user, in: reads).allows(.inbox, group: n.groupName) else { return .success(.suppressed) }
        let r = try tx.upsert(user, n, previous: existing, at: now, published: true, by: .app)
        return .success(.saved(WriteAnswer(r), created: existing == nil))
    }

    /// `PUT .../preferences` (SPEC section 12): the preferences saved, as
    /// answers show them, and the save's seq.
    func savePreferences(_ user: UserKey, _ update: PreferencesUpdate, by actor: ChangeActor, now: Millis) throws(StoreError)
        -> Result<(Preferences, seq: Int64), HeraldError>
    {
        let saved = try push.preferences(user, in: reads)
        if let v = update.ifVersion, v != saved.version {
            return .failure(HeraldError(.preconditionFailed, "the preferences are at version \(saved.version), not \(v)"))
        }
        let p = update.applied(to: saved, now: now)
        return .success((p, try tx.savePreferences(user, p, at: now, by: actor).seq))
    }

    /// The users of this partition that an app-wide send by tags reaches:
    /// every one with a registered device matching the expression.
    func audience(app: String, matching expr: TagExpression) throws(StoreError) -> [UserKey] {
        try reads.usersWithDevices(app: app).filter { entry in
            entry.devices.contains { expr.matches(Set($0.allTags(userId: entry.user))) }
        }.map { UserKey(app: app, user: $0.user) }.filter(owns)
    }

    /// One notification per user of this partition's share of the
    /// audience (SPEC section 3, bulk send): `named`, or when nil those the
    /// send's tag expression finds here; how many got one (a user whose
    /// preferences keep its group out of the inbox is not counted).
    func bulkSend(app: String, _ send: BulkSend, to named: [UserKey]?, now: Millis) throws(StoreError) -> Result<Int, HeraldError> {
        var users = named ?? []
        if named == nil, case .tags(let expr) = send.audience {
            users = try audience(app: app, matching: expr)
            try tx.claim(users)  // those found by tags, in the shared order
        }
        var reached = 0
        for u in users {
            switch try upsertNotification(u, send.draft, now: now) {
            case .failure(let err): return .failure(err)
            case .success(.saved): reached += 1
            case .success(.suppressed): break
            }
        }
        return .success(reached)
    }

    func updateState(_ user: UserKey, id: String, _ u: StateUpdate, viewer: Viewer, by actor: ChangeActor, now: Millis) throws(StoreError)
        -> Result<WriteAnswer, HeraldError>
    {
        guard let n = try reads.visibleNotification(user, id: id, viewer: viewer) else { return .failure(.notFound) }
        if let v = u.ifVersion, v != n.version {
            return .failure(HeraldError(.preconditionFailed, "version is \(n.version), not \(v)"))
        }
        do { try u.check(against: n, now: now) } catch { return .failure(error) }
        guard let m = u.applied(to: n, now: now) else { return .success(WriteAnswer(unchanged: n, seq: try reads.feed(user).head)) }
        let r = try tx.upsert(user, m, previous: n, at: now, by: actor)
        return .success(WriteAnswer(r))
    }

    func deleteNotification(_ user: UserKey, id: String, viewer: Viewer, by actor: ChangeActor,
                            now: Millis) throws(StoreError) -> Result<WriteAnswer, HeraldError> {
        guard let n = try reads.visibleNotification(user, id: id, viewer: viewer) else { return .failure(.notFound) }
        let r = try tx.delete(user, n, reason: .deleted, at: now, by: actor)
        return .success(WriteAnswer(r))
    }

    /// `POST /v1/me/notifications/read-all`: every unread notification
    /// `viewer` may see marked read (and so seen), one change each.
    func markAllRead(_ user: UserKey, viewer: Viewer, now: Millis) throws(StoreError) -> (updated: Int, seq: Int64) {
        try markAll(user, viewer: viewer, now: now, StateUpdate(readState: .read)) { $0.readState == .unread }
    }

    /// `POST /v1/me/notifications/seen-all` (SPEC section 11): every unseen
    /// notification `viewer` may see marked seen, one change each.
    func markAllSeen(_ user: UserKey, viewer: Viewer, now: Millis) throws(StoreError) -> (updated: Int, seq: Int64) {
        try markAll(user, viewer: viewer, now: now, StateUpdate(seenState: .seen)) { $0.seenState == .unseen }
    }

    /// Applies `update` to every live notification `viewer` may see that
    /// is `pending`, one change each; how many, and the feed's seq after.
    private func markAll(_ user: UserKey, viewer: Viewer, now: Millis, _ update: StateUpdate,
                         pending: (Notification) -> Bool) throws(StoreError) -> (updated: Int, seq: Int64) {
        var updated = 0
        var after: HistoryKey? = nil
        while true {
            let page = try reads.history(user, after: after, limit: 1000)
            for n in page where pending(n) && n.targeting.admits(viewer) {
                guard let m = update.applied(to: n, now: now) else { continue }
                _ = try tx.upsert(user, m, previous: n, at: now, by: .device(viewer.device?.deviceId))
                updated += 1
            }
            guard page.count == 1000, let last = page.last else { break }
            after = HistoryKey(last)
        }
        return (updated, try reads.feed(user).head)
    }

    /// The viewer of a named device: registers the device if it is new (or
    /// refuses, past `maxDevicesPerUser` with every registration connected),
    /// applies `registration` (a changed platform or tag set bumps its view
    /// generation and tells its open connections), and marks it seen.
    func registerViewer(_ user: UserKey, deviceId: String?, registration: DeviceRegistration? = nil,
                        now: Millis) throws(StoreError) -> Result<Viewer, HeraldError> {
        guard let deviceId else { return .success(.unnamed) }
        let all = try reads.devices(user)
        let existing = all.first { $0.deviceId == deviceId }
        if existing == nil, all.count >= limits.maxDevicesPerUser, !(try makeRoom(user, among: all, now: now)) {
            return .failure(HeraldError(.rateLimited, "this user has reached its limit of \(limits.maxDevicesPerUser) registered devices, "
                                        + "all connected; delete one (DELETE /v1/me/devices/{id})", retryAfterSeconds: 60))
        }
        var device = existing ?? Device(deviceId: deviceId, lastSeenAt: now)
        if let registration { device = registration.applied(to: existing, deviceId: deviceId, now: now) }
        if existing?.push != device.push { try handOver(push: device.push, to: user, deviceId, from: existing?.push) }
        if existing == nil || existing != device { try tx.saveDevice(user, device, was: existing) }
        registry.seen(user, device: deviceId, at: now)
        return .success(Viewer(userId: user.user, device: device))
    }

    /// A device's push handle changes (SPEC section 10), and a handle another registration of the app holds
    /// moves here, taking nothing of that device's outbox with it.
    private func handOver(push handle: PushHandle?, to user: UserKey, _ deviceId: String, from old: PushHandle?) throws(StoreError) {
        // Waiting pushes read the handle when they go: a new token of the
        // same service takes them, another service (or none) does not.
        if let old, old.service != handle?.service { try tx.dropPushes(user, deviceId: deviceId) }
        guard let handle else { return }
        let key = handle.key
        try releaseHandle(key, to: user, deviceId)
        // The other partitions' registrations are in their own stores
        // (memory): each gives the handle up in its next batch once this one
        // committed. In a store they share, the release above found it.
        guard partitions.count > 1, !storeIsShared else { return }
        tx.afterCommit { [self] in
            for p in partitions where p !== self {
                p.write(users: [], taken: { _ in }) { e throws(StoreError) in try e.releaseHandle(key, to: user, deviceId) }
            }
        }
    }

    /// A registration in this partition's store, other than `deviceId` of
    /// `user`, that holds the handle `key` gives it up, with its waiting pushes.
    private func releaseHandle(_ key: String, to user: UserKey, _ deviceId: String) throws(StoreError) {
        guard let holder = try reads.pushHolder(app: user.app, key: key) else { return }
        let other = UserKey(app: user.app, user: holder.user)
        guard other != user || holder.deviceId != deviceId, let d = try reads.device(other, id: holder.deviceId) else { return }
        try tx.removeHandle(other, from: d, .moved)
    }

    /// `body` with the viewer of `deviceId`, unless its registration is refused.
    func withViewer<T>(_ user: UserKey, deviceId: String?, registration: DeviceRegistration? = nil, now: Millis,
                       _ body: (Viewer) throws(StoreError) -> Result<T, HeraldError>) throws(StoreError) -> Result<T, HeraldError> {
        switch try registerViewer(user, deviceId: deviceId, registration: registration, now: now) {
        case .failure(let e): return .failure(e)
        case .success(let v): return try body(v)
        }
    }

    /// Past `maxDevicesPerUser` (any device token could otherwise name new
    /// devices without end: rows that every listing and send by tags
    /// reads): the registrations not connected to any node and seen longest
    /// ago go, until one more fits. False when not enough are unconnected.
    private func makeRoom(_ user: UserKey, among all: [Device], now: Millis) throws(StoreError) -> Bool {
        let elsewhere = try cluster?.elsewhere(user) ?? [:]
        func seen(_ d: Device) -> Millis { max(d.lastSeenAt, registry.connections(user, device: d.deviceId)?.lastSeenAt ?? 0) }
        let idle = all.filter { d in
            elsewhere[d.deviceId] == nil && registry.connections(user, device: d.deviceId)?.transport(now: now) == nil
        }
        let excess = all.count - limits.maxDevicesPerUser + 1
        guard idle.count >= excess else { return false }
        for d in idle.sorted(by: { seen($0) < seen($1) }).prefix(excess) { _ = try deleteDevice(user, deviceId: d.deviceId) }
        return true
    }

    /// `PUT /v1/me/devices/{id}`: the device as the listing shows it.
    func registerDevice(_ user: UserKey, deviceId: String, _ reg: DeviceRegistration, now: Millis) throws(StoreError) -> Result<JSON, HeraldError> {
        try withViewer(user, deviceId: deviceId, registration: reg, now: now) { _ throws(StoreError) in
            guard let d = try reads.device(user, id: deviceId) else { throw StoreError("device \(deviceId) vanished after saving") }
            return .success(try listed(user, d, now: now))
        }
    }

    /// One registration as the devices listing shows it, connected here or
    /// on another live node.
    func listed(_ user: UserKey, _ d: Device, now: Millis) throws(StoreError) -> JSON {
        deviceJSON(user, d, elsewhere: try cluster?.elsewhere(user)[d.deviceId], now: now)
    }

    /// `GET /v1/apps/{app}/users/{user}/devices`: connected to this node or,
    /// in a cluster, to another live one.
    func deviceListing(_ user: UserKey, now: Millis) throws(StoreError) -> JSON {
        let elsewhere = try cluster?.elsewhere(user) ?? [:]
        return .array(try reads.devices(user).map { deviceJSON(user, $0, elsewhere: elsewhere[$0.deviceId], now: now) })
    }

    /// A registration as the devices listing shows it.
    func deviceJSON(_ user: UserKey, _ d: Device, elsewhere: TransportKind?, now: Millis) -> JSON {
        let c = registry.connections(user, device: d.deviceId)
        let here = c?.transport(now: now)
        let transport = here.map { h in elsewhere.map { TransportKind.best(h, $0) } ?? h } ?? elsewhere
        return ["deviceId": .string(d.deviceId), "platform": .string(d.platform.rawValue),
                "tags": .array(d.allTags(userId: user.user).map(JSON.string)),
                "connected": .bool(transport != nil), "transport": transport.map { .string($0.rawValue) } ?? .null,
                "lastSeenAt": .string(RFC3339.format(max(d.lastSeenAt, c?.lastSeenAt ?? 0))),
                "push": d.push?.listing ?? .null]
    }

    /// Deletes a registration; its open connections, on every node, close with 4003.
    func deleteDevice(_ user: UserKey, deviceId: String) throws(StoreError) -> Bool {
        try tx.deleteDevice(user, id: deviceId)
    }

    /// Tells `shards` that `deviceId` is now registered as `device` (nil: deleted).
    func tell(_ shards: [Shard], _ user: UserKey, _ deviceId: String, _ device: Device?) {
        guard let device else {
            for s in shards { s.post { s.deviceDeleted(user, deviceId: deviceId) } }
            return
        }
        let v = Viewer(userId: user.user, device: device)
        for s in shards { s.post { s.viewerChanged(user, deviceId: deviceId, viewer: v) } }
    }
}
