import HeraldCore

/// Long-poll sync and Server-Sent Events (SPEC section 4) for devices that
/// cannot hold a WebSocket. Both resume from a cursor with the same
/// catch-up-then-live hand-over as WebSockets (see Engine).
extension Gateway {
    static let keepAliveMillis: Millis = 15_000

    func fallback(_ route: Route, _ req: HTTPRequest, _ d: DeviceContext, shard: Shard, responder: HTTPResponder) throws(HeraldError) {
        var position = FeedPosition(cursor: nil, epoch: req.queryValue("epoch"))
        if let c = req.queryValue("cursor") { position.cursor = try Self.cursor(c, "cursor") }
        if route == .myEvents {
            if let last = req.headers["last-event-id"], !last.isEmpty { position.cursor = try Self.cursor(last, "Last-Event-ID") }
            return openEventStream(d, position, shard: shard, responder: responder)
        }
        var limit = 500
        if let l = req.queryValue("limit") {
            guard let v = Int(l), (1...500).contains(v) else { throw HeraldError.badRequest("limit must be 1 to 500") }
            limit = v
        }
        var wait = 0
        if let w = req.queryValue("wait") {
            guard let v = Int(w), (0...60).contains(v) else { throw HeraldError.badRequest("wait must be 0 to 60 seconds") }
            wait = v
        }
        sync(d, position, limit: limit, wait: wait, shard: shard, responder: responder)
    }

    static func cursor(_ s: String, _ name: String) throws(HeraldError) -> Int64 {
        guard let v = Int64(s), v >= 0 else { throw HeraldError.badRequest("\(name) must be a non-negative integer") }
        return v
    }

    private func sync(_ d: DeviceContext, _ position: FeedPosition, limit: Int, wait: Int, shard: Shard, responder: HTTPResponder) {
        let user = d.user, device = d.deviceId
        engine.submit({ e in
            let now = WallClock.now()
            let v = try e.viewer(user, deviceId: device, now: now)
            e.markPolled(user, deviceId: device, now: now)
            let epoch = v.epoch(store: e.store.epoch)
            let reached: Int64
            switch try e.catchUp(user, viewer: v, from: position, limit: limit, resetLimit: limit) {
            case .reset(let notifications, let next, let head):
                let body = SyncBody.reset(notifications, next: next, cursor: head, epoch: epoch)
                e.afterCommit { shard.post { responder.respond(.json(200, body)) } }
                return
            case .changes(let list, let at, let more):
                reached = at
                if !list.isEmpty || wait == 0 {
                    let body = SyncBody.changes(list.map(\.bytes), cursor: reached, epoch: epoch, hasMore: more)
                    e.afterCommit { shard.post { responder.respond(HTTPResponse(status: 200, body: body)) } }
                    return
                }
            }
            // Nothing yet: hold the request until a change this device may see.
            guard self.heldPolls.load(ordering: .relaxed) < self.config.limits.maxHeldPolls else {
                let err = HeraldError(.rateLimited, "too many held polls; retry shortly", retryAfterSeconds: 1)
                e.afterCommit { shard.post { responder.respond(.error(err)) } }
                return
            }
            self.heldPolls.add(1, ordering: .relaxed)
            e.afterCommit {
                e.follow(user, shard: shard.index)
                e.connectionOpened(user, deviceId: device, transport: .poll, now: now)
                shard.post {
                    HeldPoll(gateway: self, shard: shard, user: user, deviceId: device, viewer: v, cursor: reached,
                             epoch: epoch, limit: limit, responder: responder, until: now + Millis(wait) * 1000).start()
                }
            }
        }, failed: { err in shard.post { responder.respond(.error(err)) } })
    }

    private func openEventStream(_ d: DeviceContext, _ position: FeedPosition, shard: Shard, responder: HTTPResponder) {
        let user = d.user, device = d.deviceId, expiresAt = d.claims.expiresAt * 1000
        let maxConnections = config.limits.maxConnectionsPerUser
        engine.submit({ e in
            let now = WallClock.now()
            guard e.followers(of: user) < maxConnections else {
                let err = HeraldError(.rateLimited, "this user has \(maxConnections) connections open already", retryAfterSeconds: 5)
                e.afterCommit { shard.post { responder.respond(.error(err)) } }
                return
            }
            let v = try e.viewer(user, deviceId: device, now: now)
            let epoch = v.epoch(store: e.store.epoch)
            let first: [UInt8]
            switch try e.catchUp(user, viewer: v, from: position, resetLimit: 500) {
            case .changes(let list, let head, _):
                first = list.flatMap { EventStream.event(id: $0.seq, name: "change", data: $0.bytes) }
                e.afterCommit { self.startStream(e, user, device, v, head, first, shard, responder, now, expiresAt) }
            case .reset(let page, let next, let head):
                let body = SyncBody.reset(page, next: next, cursor: head, epoch: epoch).encoded
                first = EventStream.event(id: head, name: "reset", data: body)
                e.afterCommit { self.startStream(e, user, device, v, head, first, shard, responder, now, expiresAt) }
            }
        }, failed: { err in shard.post { responder.respond(.error(err)) } })
    }

    /// Engine thread, after commit: follow the user, then hand the stream to its shard.
    private func startStream(_ e: Engine, _ user: UserKey, _ device: String?, _ v: Viewer, _ head: Int64, _ first: [UInt8],
                             _ shard: Shard, _ responder: HTTPResponder, _ now: Millis, _ expiresAt: Millis) {
        e.follow(user, shard: shard.index)
        e.connectionOpened(user, deviceId: device, transport: .sse, now: now)
        shard.post {
            EventStream(gateway: self, shard: shard, user: user, deviceId: device, viewer: v, cursor: head,
                        responder: responder).start(first, tokenExpiresAt: expiresAt)
        }
    }

    /// Ends a fallback follower's follow on the engine.
    func release(_ user: UserKey, deviceId: String?, shard: Shard, transport: Metrics.Transport) {
        engine.control { e in
            e.unfollow(user, shard: shard.index)
            e.connectionClosed(user, deviceId: deviceId, transport: transport, now: WallClock.now())
        }
    }
}

/// Bodies of `GET /v1/me/sync`, with changes spliced in already encoded.
enum SyncBody {
    static func changes(_ encoded: [[UInt8]], cursor: Int64, epoch: String, hasMore: Bool) -> [UInt8] {
        var out: [UInt8] = Array(#"{"changes":["#.utf8)
        for (k, c) in encoded.enumerated() {
            if k > 0 { out.append(UInt8(ascii: ",")) }
            out.append(contentsOf: c)
        }
        out.append(contentsOf: "],\"cursor\":\(cursor),\"epoch\":".utf8)
        JSON.encodeString(epoch, into: &out)
        out.append(contentsOf: ",\"hasMore\":\(hasMore)}".utf8)
        return out
    }

    static func reset(_ notifications: [Notification], next: String?, cursor: Int64, epoch: String) -> JSON {
        ["reset": true, "notifications": .array(notifications.map(\.json)), "next": next.json,
         "cursor": .int(cursor), "epoch": .string(epoch)]
    }
}

/// What held polls and event streams share: an HTTP answer that follows
/// one user's feed on a shard until it ends, once.
class HTTPFollower: FeedFollower {
    let gateway: Gateway
    let shard: Shard
    let userKey: UserKey
    let deviceId: String?
    let transport: Metrics.Transport
    let responder: HTTPResponder
    var viewer: Viewer
    var cursor: Int64
    private(set) var done = false

    init(gateway: Gateway, shard: Shard, user: UserKey, deviceId: String?, viewer: Viewer, cursor: Int64,
         responder: HTTPResponder, transport: Metrics.Transport) {
        self.gateway = gateway; self.shard = shard; userKey = user; self.deviceId = deviceId; self.viewer = viewer
        self.cursor = cursor; self.responder = responder; self.transport = transport
    }

    /// Starts following on the shard; the follow ends if the client goes away.
    func begin() {
        shard.add(self)
        gateway.metrics.connectionOpened(transport)
        responder.onClose { [weak self] in self?.end() }
    }

    /// Stops following: on the shard now, on the engine next.
    func end() {
        guard !done else { return }
        done = true
        shard.remove(self)
        gateway.metrics.connectionClosed(transport)
        gateway.release(userKey, deviceId: deviceId, shard: shard, transport: transport)
    }

    func deliver(_ records: [ChangeRecord]) {}
    func viewerChanged(_ v: Viewer) { viewer = v }
    func deviceDeleted() { shutdown() }
    func shutdown() {}
}

/// A `sync` request held until a change the device may see, or its deadline.
final class HeldPoll: HTTPFollower {
    private let epoch: String
    private let limit: Int
    private let until: Millis

    init(gateway: Gateway, shard: Shard, user: UserKey, deviceId: String?, viewer: Viewer, cursor: Int64, epoch: String,
         limit: Int, responder: HTTPResponder, until: Millis) {
        self.epoch = epoch; self.limit = limit; self.until = until
        super.init(gateway: gateway, shard: shard, user: user, deviceId: deviceId, viewer: viewer, cursor: cursor,
                   responder: responder, transport: .poll)
    }

    func start() {
        begin()
        shard.schedule(at: until) { [weak self] in self?.answer([], more: false) }
    }

    override func deliver(_ records: [ChangeRecord]) {
        guard !done else { return }
        var found: [[UInt8]] = []
        var more = false
        for r in records where r.seq > cursor {
            if let b = r.bytes(for: viewer) {
                if found.count == limit { more = true; break }
                found.append(b)
            }
            cursor = r.seq
        }
        if !found.isEmpty {
            gateway.metrics.deliveries.add(found.count, ordering: .relaxed)
            answer(found, more: more)
        }
    }

    private func answer(_ changes: [[UInt8]], more: Bool) {
        guard !done else { return }
        responder.respond(HTTPResponse(status: 200, body: SyncBody.changes(changes, cursor: cursor, epoch: epoch, hasMore: more)))
        end()
    }

    override func end() {
        if !done { gateway.heldPolls.subtract(1, ordering: .relaxed) }
        super.end()
    }

    override func shutdown() { answer([], more: false) }
}

/// A Server-Sent Events stream: one `change` event per change, `id:` its seq.
final class EventStream: HTTPFollower {
    init(gateway: Gateway, shard: Shard, user: UserKey, deviceId: String?, viewer: Viewer, cursor: Int64, responder: HTTPResponder) {
        super.init(gateway: gateway, shard: shard, user: user, deviceId: deviceId, viewer: viewer, cursor: cursor,
                   responder: responder, transport: .sse)
    }

    static func event(id: Int64, name: String, data: [UInt8]) -> [UInt8] {
        Array("id: \(id)\nevent: \(name)\ndata: ".utf8) + data + [0x0A, 0x0A]
    }

    /// The stream ends when its token expires; EventSource then reconnects,
    /// with a fresh token in its URL.
    func start(_ first: [UInt8], tokenExpiresAt: Millis) {
        begin()
        shard.schedule(at: tokenExpiresAt) { [weak self] in
            guard let self, !self.done else { return }
            self.gateway.metrics.dropped(.authExpired)
            self.shutdown()
        }
        responder.startStream(contentType: "text/event-stream", headers: [("Cache-Control", "no-cache"), ("X-Accel-Buffering", "no")])
        responder.send(first)
        keepAlive()
    }

    private func keepAlive() {
        shard.schedule(at: WallClock.now() + Gateway.keepAliveMillis) { [weak self] in
            guard let self, !self.done else { return }
            self.responder.send(Array(": keep-alive\n\n".utf8))
            self.keepAlive()
        }
    }

    override func deliver(_ records: [ChangeRecord]) {
        guard !done else { return }
        var out: [UInt8] = []
        var sent = 0
        for r in records where r.seq > cursor {
            cursor = r.seq
            if let b = r.bytes(for: viewer) {
                out += Self.event(id: r.seq, name: "change", data: b)
                sent += 1
            }
        }
        guard sent > 0 else { return }
        gateway.metrics.deliveries.add(sent, ordering: .relaxed)
        responder.send(out)
        if responder.queuedBytes > gateway.config.limits.maxQueuedBytesPerConnection {
            gateway.metrics.dropped(.slowConsumer)
            shutdown()
        }
    }

    /// Ends the stream after what is queued (closing the connection).
    override func shutdown() {
        guard !done else { return }
        responder.finish()
        end()
    }
}
