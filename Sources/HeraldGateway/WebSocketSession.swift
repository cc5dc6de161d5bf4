import HeraldCore

/// The transport side of a WebSocket, as a session sees it.
public protocol WebSocketOutput: AnyObject {
    /// Asks the transport to write: it calls `writePending` when the socket
    /// can take more, and once nothing is left honours `closeRequest`.
    func requestWrite()
}

/// WebSocket close codes of SPEC section 5.
public enum CloseCode: UInt16, Sendable {
    case goingAway = 1001, policyViolation = 1008, unsupportedData = 1003, invalidPayload = 1007, tooBig = 1009
    case unauthenticated = 4001, forbiddenDevice = 4003, policy = 4008
}

/// One device's WebSocket conversation (SPEC section 5), independent of
/// libwebsockets. Lives on its shard's thread.
public final class WebSocketSession: FeedFollower, @unchecked Sendable {
    enum State { case awaitingHello, subscribing, live, closed }

    enum Outgoing {
        case frame([UInt8])
        /// A live change, merged with its neighbours into one `changes` frame.
        case change(seq: Int64, bytes: [UInt8])

        var size: Int {
            switch self {
            case .frame(let b): b.count
            case .change(_, let b): b.count
            }
        }
    }

    let gateway: Gateway
    let shard: Shard
    unowned let output: WebSocketOutput
    public let connectionId: String
    private var state = State.awaitingHello
    private(set) var userKey = UserKey(app: "", user: "")
    private(set) var deviceId: String?
    private var claims: DeviceClaims?
    private var viewer = Viewer.unnamed
    private var cursor: Int64 = 0
    private var unread = 0
    private var queue: [Outgoing] = []
    private var queueHead = 0
    private var queuedBytes = 0
    private var waitingForLive: [[UInt8]] = []
    /// Bumped by `refresh` so timers of the old token do nothing.
    private var tokenGeneration = 0
    public private(set) var closeRequest: (code: CloseCode, reason: String)?
    private var messageBudget: TokenBucket

    init(gateway: Gateway, shard: Shard, output: WebSocketOutput, now: Millis) {
        self.gateway = gateway; self.shard = shard; self.output = output
        // 14 characters: a Swift small string, no allocation per connection.
        connectionId = "c_" + Random.hex(6)
        let rate = Double(gateway.config.limits.messagesPerSecondPerConnection)
        messageBudget = TokenBucket(rate: rate, burst: 2 * rate, now: now)
        gateway.metrics.connectionOpened(.websocket)
        shard.schedule(at: now + gateway.config.limits.helloTimeoutSeconds * 1000) { [weak self] in
            guard let self, self.state == .awaitingHello else { return }
            self.fail(.unauthenticated, HeraldError(.unauthorized, "no hello within \(gateway.config.limits.helloTimeoutSeconds) s"))
        }
    }

    public var hasPendingOutput: Bool { queueHead < queue.count }

    // MARK: Input

    public enum Incoming { case text([UInt8]), binary, tooBig }

    public func receive(_ m: Incoming) {
        guard state != .closed, closeRequest == nil else { return }
        switch m {
        case .binary: return close(.unsupportedData, "binary frames are not supported", drop: .protocolError)
        case .tooBig: return close(.tooBig, "message larger than \(gateway.config.limits.maxMessageBytes) bytes", drop: .protocolError)
        case .text(let bytes):
            if case .failure = messageBudget.take(now: WallClock.now()) {
                return close(.policy, "more than \(Int(messageBudget.rate)) messages per second", drop: .rateLimited)
            }
            if state == .subscribing {
                guard waitingForLive.count < 64 else { return close(.policy, "too many messages before welcome", drop: .rateLimited) }
                waitingForLive.append(bytes)
                return
            }
            handle(bytes)
        }
    }

    private func handle(_ bytes: [UInt8]) {
        let json: JSON
        do { json = try JSONParser.parse(bytes) } catch {
            if error.invalidUTF8 { return close(.invalidPayload, "invalid UTF-8", drop: .protocolError) }
            if state == .awaitingHello { return fail(.policyViolation, .badRequest(error.message)) }
            return send(ServerFrame.error(ref: nil, .badRequest(error.message)))
        }
        switch ClientMessage.decode(json) {
        case .failure(let e):
            if state == .awaitingHello {
                if e.missingToken || !e.isHello {
                    return fail(.unauthenticated, e.isHello ? e.error : HeraldError(.unauthorized, "the first message must be hello"))
                }
                return fail(.policyViolation, e.error)
            }
            send(ServerFrame.error(ref: e.ref, e.error))
        case .success(let m):
            if state == .awaitingHello {
                guard case .hello(let token, let device, let reg, let position) = m else {
                    return fail(.unauthenticated, HeraldError(.unauthorized, "the first message must be hello"))
                }
                return hello(token: token, deviceId: device, registration: reg, position: position)
            }
            live(m)
        }
    }

    private func hello(token: String, deviceId: String, registration: DeviceRegistration, position: FeedPosition) {
        let c: DeviceClaims
        switch gateway.verify(token: token) {
        case .failure(let e): return fail(.unauthenticated, e)
        case .success(let v): c = v
        }
        if let bound = c.device, bound != deviceId {
            return fail(.forbiddenDevice, HeraldError(.forbidden, "the token is bound to another device"))
        }
        claims = c
        userKey = c.userKey
        self.deviceId = deviceId
        state = .subscribing
        let user = c.userKey, shard = self.shard
        let maxConnections = gateway.config.limits.maxConnectionsPerUser
        gateway.engine.submit({ [self] e in
            let now = WallClock.now()
            guard e.followers(of: user) < maxConnections else {
                e.afterCommit { shard.post { self.tooManyConnections(maxConnections) } }
                return
            }
            let v = try e.viewer(user, deviceId: deviceId, registration: registration, now: now)
            let catchUp = try e.catchUp(user, viewer: v, from: position)
            let unread = try e.counts(user, viewer: v).unread
            let epoch = v.epoch(store: e.store.epoch)
            e.afterCommit {
                e.follow(user, shard: shard.index)
                e.connectionOpened(user, deviceId: deviceId, transport: .websocket, now: now)
                shard.post { self.start(viewer: v, catchUp: catchUp, epoch: epoch, unread: unread) }
            }
        }, failed: { [self] err in shard.post { self.fail(.goingAway, err) } })
    }

    private func tooManyConnections(_ max: Int) {
        fail(.policy, HeraldError(.rateLimited, "this user has \(max) connections open already"), drop: .rateLimited)
    }

    /// On the shard, after the engine read the catch-up and started
    /// following: send it, then welcome, then go live.
    private func start(viewer v: Viewer, catchUp: Engine.CatchUp, epoch: String, unread u: Int) {
        guard state == .subscribing else {
            // Closed while subscribing: undo the engine's follow.
            return releaseFollow()
        }
        viewer = v
        unread = u
        shard.add(self)
        cursor = sendCatchUp(catchUp, epoch: epoch)
        send(ServerFrame.welcome(cursor: cursor, epoch: epoch, connectionId: connectionId, unread: u))
        state = .live
        scheduleTokenTimers()
        let early = waitingForLive
        waitingForLive = []
        for m in early where closeRequest == nil { handle(m) }
    }

    /// Queues catch-up frames (SPEC section 5); returns the position reached.
    private func sendCatchUp(_ c: Engine.CatchUp, epoch: String) -> Int64 {
        switch c {
        case .changes(let list, let head, _):
            var i = 0
            while i < list.count {
                let chunk = list[i..<min(list.count, i + 500)]
                i += chunk.count
                send(ServerFrame.changes(chunk.map(\.bytes), cursor: i == list.count ? head : chunk.last!.seq))
            }
            return head
        case .reset(let notifications, _, let head):
            var i = 0
            repeat {
                let chunk = Array(notifications[i..<min(notifications.count, i + 500)])
                i += chunk.count
                send(ServerFrame.reset(chunk, cursor: head, epoch: epoch, final: i >= notifications.count))
            } while i < notifications.count
            return head
        }
    }

    private func live(_ m: ClientMessage) {
        let user = userKey, v = viewer, shard = self.shard
        switch m {
        case .hello:
            send(ServerFrame.error(ref: nil, .badRequest("already said hello")))
        case .ping(let ref):
            send(ServerFrame.pong(ref: ref))
        case .refresh(let ref, let token):
            refresh(ref: ref, token: token)
        case .update(let ref, let id, let u):
            request(ref) { e in
                switch try e.updateState(user, id: id, u, viewer: v, now: WallClock.now()) {
                case .success(let (n, seq)): return .success(["notification": n.json, "seq": .int(seq)])
                case .failure(let err): return .failure(err)
                }
            }
        case .delete(let ref, let id):
            request(ref) { e in try e.delete(user, id: id, viewer: v, now: WallClock.now()).map { ["seq": .int($0)] } }
        case .sync(let ref, let position):
            gateway.engine.submit({ [self] e in
                let c = try e.catchUp(user, viewer: v, from: position)
                let epoch = v.epoch(store: e.store.epoch)
                e.afterCommit {
                    shard.post {
                        guard self.state == .live else { return }
                        let reached = self.sendCatchUp(c, epoch: epoch)
                        self.cursor = max(self.cursor, reached)
                        self.send(ServerFrame.ack(ref: ref, extra: ["cursor": .int(reached)]))
                    }
                }
            }, failed: { [self] err in shard.post { self.send(ServerFrame.error(ref: ref, err)) } })
        }
    }

    /// Runs `body` on the engine and answers `ack` (with its fields) or `error`.
    private func request(_ ref: String?, _ body: @escaping @Sendable (Engine) throws -> Result<JSONObject, HeraldError>) {
        let shard = self.shard
        gateway.engine.submit({ [self] e in
            let r = try body(e)
            e.afterCommit {
                shard.post {
                    switch r {
                    case .success(let extra): self.send(ServerFrame.ack(ref: ref, extra: extra))
                    case .failure(let err): self.send(ServerFrame.error(ref: ref, err))
                    }
                }
            }
        }, failed: { [self] err in shard.post { self.send(ServerFrame.error(ref: ref, err)) } })
    }

    private func refresh(ref: String?, token: String) {
        switch gateway.verify(token: token) {
        case .failure(let e):
            send(ServerFrame.error(ref: ref, e))
        case .success(let c):
            guard c.userKey == userKey, c.device == nil || c.device == deviceId else {
                return send(ServerFrame.error(ref: ref, HeraldError(.forbidden, "the token is for another app, user or device")))
            }
            claims = c
            tokenGeneration += 1
            scheduleTokenTimers()
            send(ServerFrame.ack(ref: ref, extra: ["expiresAt": .string(RFC3339.format(c.expiresAt * 1000))]))
        }
    }

    private func scheduleTokenTimers() {
        guard let claims else { return }
        let gen = tokenGeneration
        let exp = claims.expiresAt * 1000
        // The expiry timer is armed by the warning one: one pending timer per
        // idle connection instead of two (about 100 bytes each).
        shard.schedule(at: exp - 60_000) { [weak self] in
            guard let self, self.tokenGeneration == gen, self.state == .live else { return }
            self.send(ServerFrame.tokenExpiring(exp))
            self.shard.schedule(at: exp) { [weak self] in
                guard let self, self.tokenGeneration == gen, self.state == .live else { return }
                self.close(.unauthenticated, "token expired", drop: .authExpired)
            }
        }
    }

    // MARK: FeedFollower

    func deliver(_ records: [ChangeRecord]) {
        guard state == .live else { return }
        var delta = 0
        var sent = 0
        for r in records where r.seq > cursor {
            cursor = r.seq
            delta += r.unreadDelta(for: viewer)
            if let b = r.bytes(for: viewer) {
                enqueue(.change(seq: r.seq, bytes: b))
                sent += 1
            }
        }
        if delta != 0 {
            unread += delta
            enqueue(.frame(ServerFrame.counts(unread: unread)))
        }
        if sent > 0 { gateway.metrics.deliveries.add(sent, ordering: .relaxed) }
        if sent > 0 || delta != 0 { flushOrDrop() }
    }

    func viewerChanged(_ v: Viewer) { viewer = v }

    func deviceDeleted() { close(.forbiddenDevice, "device deleted", drop: nil) }

    // MARK: Output

    private func enqueue(_ o: Outgoing) {
        queue.append(o)
        queuedBytes += o.size
    }

    private func send(_ frame: [UInt8]) {
        guard state != .closed else { return }
        enqueue(.frame(frame))
        flushOrDrop()
    }

    private func flushOrDrop() {
        if queuedBytes > gateway.config.limits.maxQueuedBytesPerConnection {
            // A consumer this far behind would hold memory for everyone: cut it off.
            queue.removeAll()
            queueHead = 0
            queuedBytes = 0
            return close(.policy, "slow consumer", drop: .slowConsumer)
        }
        output.requestWrite()
    }

    /// Moves queued messages into `out`, each after `header(&out, length)`,
    /// until nothing is left or `out` holds `limit` bytes; queued live
    /// changes merge into one `changes` frame (at most 500 each).
    public func writePending(into out: inout [UInt8], limit: Int, header: (inout [UInt8], Int) -> Void) {
        while queueHead < queue.count, out.count < limit {
            let first = queue[queueHead]
            queueHead += 1
            queuedBytes -= first.size
            switch first {
            case .frame(let b):
                header(&out, b.count)
                out.append(contentsOf: b)
            case .change(let seq, let b):
                var batch = [b]
                var last = seq
                while queueHead < queue.count, batch.count < 500, case .change(let s, let nb) = queue[queueHead] {
                    batch.append(nb)
                    last = s
                    queueHead += 1
                    queuedBytes -= nb.count
                }
                ServerFrame.appendLive(batch[...], cursor: last, to: &out, header: header)
            }
        }
        if queueHead == queue.count || queueHead > 1024 {
            queue.removeFirst(queueHead)
            queueHead = 0
        }
    }

    // MARK: Closing

    private func fail(_ code: CloseCode, _ e: HeraldError, drop: Metrics.DropReason = .protocolError) {
        send(ServerFrame.error(ref: nil, e))
        close(code, e.message, drop: drop)
    }

    /// Closes after what is queued has been written.
    func close(_ code: CloseCode, _ reason: String, drop: Metrics.DropReason?) {
        guard closeRequest == nil, state != .closed else { return }
        if let drop, code != .goingAway { gateway.metrics.dropped(drop) }
        closeRequest = (code, String(reason.utf8.prefix(120))!)
        output.requestWrite()
    }

    /// Gateway shutdown: 1001 to everyone.
    public func shutdown() { close(.goingAway, "gateway shutting down", drop: nil) }

    /// The transport closed the connection (either side).
    public func transportClosed() {
        let wasLive = state == .live
        state = .closed
        queue.removeAll()
        gateway.metrics.connectionClosed(.websocket)
        if wasLive {
            shard.remove(self)
            releaseFollow()
        }
    }

    private func releaseFollow() {
        let user = userKey, device = deviceId, index = shard.index
        gateway.engine.control { e in
            e.unfollow(user, shard: index)
            e.connectionClosed(user, deviceId: device, transport: .websocket, now: WallClock.now())
        }
    }
}
