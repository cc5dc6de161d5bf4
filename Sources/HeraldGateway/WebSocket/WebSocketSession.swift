import HeraldCore
import HeraldCrypto
import HeraldPorts

/// The transport side of a WebSocket, as a session sees it.
public protocol WebSocketOutput: AnyObject {
    /// Asks the transport to write: it calls `writePending` when the socket
    /// can take more, and once nothing is left honours `closeRequest`.
    func requestWrite()
    /// Drops the connection without a close frame (a peer that went silent).
    func hangUp()
}

/// WebSocket close codes of SPEC section 5.
public enum CloseCode: UInt16, Sendable {
    case normal = 1000, goingAway = 1001, protocolError = 1002, policyViolation = 1008, unsupportedData = 1003, invalidPayload = 1007, tooBig = 1009
    case unauthenticated = 4001, forbiddenDevice = 4003, policy = 4008
}

/// One device's WebSocket conversation (SPEC section 5), independent of
/// libwebsockets: the hello, requests and token timers. Its feed is a
/// `Subscription`, for which it is the output. Lives on its shard's loop.
public final class WebSocketSession {
    enum State { case awaitingHello, subscribing, live, closed }

    let gateway: Gateway
    let shard: Shard
    unowned let transport: WebSocketOutput
    /// The upgrade's `Origin`, checked at hello: only the token names the app.
    let origin: String?
    private var state = State.awaitingHello
    private var subscription: Subscription?
    /// The current token's `exp` (seconds), once a hello was accepted (0
    /// before): all the session keeps of its claims (the subscription has
    /// user and device).
    private var tokenExpiresAt: Int64 = 0
    private var outbox = WebSocketOutbox()
    private var drainWaiter: (below: Int, run: () -> Void)?
    /// Requests that came before `welcome`, answered after it.
    private var waitingForLive: [[UInt8]] = []
    /// The hello deadline, then the token's warning or expiry: one pending
    /// timer at a time, cancelled when the connection closes.
    private var timer = Shard.TimerID.none
    /// When the client last sent anything (a tick), and the timer that pings it
    /// after `pingIntervalSeconds` of silence and hangs up after
    /// `idleHangupSeconds`.
    private var lastHeard: Millis
    private var keepalive = Shard.TimerID.none
    /// While output waits: the tick the socket last took some (or the
    /// keep-alive first saw it waiting). A client that sends but never reads
    /// is never silent; this is how it is told from one that reads slowly.
    private var writeWaitingSince: Millis?
    /// When the socket last took part of a backlog, more of it still
    /// waiting: a client reading a long backlog is alive even while its pong
    /// waits behind it. (A write that empties the queue, such as our own
    /// ping, proves nothing: the kernel takes it whether or not anyone reads.)
    private var lastDraining: Millis = 0
    public private(set) var closeRequest: (code: CloseCode, reason: String)?
    /// Messages and control frames from the client (PROTOCOL section 13, Limits).
    private var messageBudget: TokenBucket
    /// Our keep-alive ping went out and no pong came since.
    private var pingUnanswered = false

    static let maxQueuedSyncs = 8

    init(gateway: Gateway, shard: Shard, transport: WebSocketOutput, origin: String?) {
        shard.thread.preconditionCurrent()
        self.gateway = gateway; self.shard = shard; self.transport = transport; self.origin = origin
        let now = gateway.clock.ticks(), limits = gateway.config.limits
        let rate = Double(limits.messagesPerSecondPerConnection)
        messageBudget = TokenBucket(rate: rate, burst: 2 * rate, now: now)
        lastHeard = now
        gateway.metrics.connectionOpened(.websocket)
        // The closure takes the one limit it says, not all of them: its
        // context lives in the shard's timers for as long as the deadline.
        let helloSeconds = limits.helloTimeoutSeconds
        timer = shard.schedule(at: now + helloSeconds * 1000) { [weak self] in
            guard let self, self.state == .awaitingHello else { return }
            self.fail(.unauthenticated, HeraldError(.unauthorized, "no hello within \(helloSeconds) s"))
        }
        scheduleKeepalive(at: now + Millis(limits.pingIntervalSeconds) * 1000)
    }

    // MARK: Input

    public enum Incoming {
        case text([UInt8]), binary, tooBig
        /// The client's close frame (its body): answered with ours.
        case close([UInt8])
        case protocolError(String)
    }

    /// The transport read bytes from the client. Once a close is asked for,
    /// only the client's close frame counts: a client that sends but never
    /// reads (our close frame waits behind what it left unread) is hung up
    /// on after `idleHangupSeconds` like a silent one.
    public func heard() {
        if closeRequest == nil { lastHeard = gateway.clock.ticks() }
    }

    /// Answers a ping with its payload (RFC 6455 5.5.3). Pings count
    /// against the message rate: each costs a pong.
    public func ping(_ payload: [UInt8]) {
        guard state != .closed, closeRequest == nil, withinRate() else { return }
        outbox.append(control: WebSocketOutbox.pong, payload)
        transport.requestWrite()
    }

    /// A pong: the answer to our keep-alive ping is free, any other (RFC
    /// 6455 5.5.3 allows unsolicited ones) counts against the message rate.
    public func pong() {
        guard state != .closed, closeRequest == nil else { return }
        if pingUnanswered { pingUnanswered = false } else { _ = withinRate() }
    }

    /// Takes one message from the budget; past it, closes 4008.
    private func withinRate() -> Bool {
        guard case .failure = messageBudget.take(now: gateway.clock.ticks()) else { return true }
        close(.policy, "more than \(Int(messageBudget.rate)) messages per second", drop: .rateLimited)
        return false
    }

    public func receive(_ m: Incoming) {
        guard state != .closed, closeRequest == nil else { return }
        switch m {
        case .close(let body):
            let answer = Self.answer(toClose: body)
            return close(answer.code, answer.reason, drop: answer.code == .normal ? nil : .protocolError)
        case .protocolError(let why): return close(.protocolError, why, drop: .protocolError)
        case .binary: return close(.unsupportedData, "binary frames are not supported", drop: .protocolError)
        case .tooBig: return close(.tooBig, "message larger than \(gateway.config.limits.maxMessageBytes) bytes", drop: .protocolError)
        case .text(let bytes):
            guard withinRate() else { return }
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
        let v: DeviceToken.Verified
        switch gateway.verify(token: token) {
        case .failure(let e): return fail(.unauthenticated, e)
        case .success(let ok): v = ok
        }
        let c = v.claims
        if let bound = c.device, bound != deviceId {
            return fail(.forbiddenDevice, HeraldError(.forbidden, "the token is bound to another device"))
        }
        if let app = gateway.apps[c.app], !app.admits(origin: origin) { return fail(.forbiddenDevice, Gateway.originRefused) }
        if let e = gateway.pushRefusal(app: c.app, registration) { return fail(.policyViolation, e) }
        tokenExpiresAt = c.expiresAt
        state = .subscribing
        let s = Subscription(Subscription.Request(user: c.userKey, deviceId: deviceId, position: position, transport: .websocket),
                             signature: v.signature, gateway: gateway, shard: shard, output: self)
        subscription = s
        s.start(registering: registration)
    }

    private func live(_ m: ClientMessage) {
        guard let s = subscription else { return }
        let user = s.user, v = s.viewer, clock = gateway.clock
        switch m {
        case .hello:
            send(ServerFrame.error(ref: nil, .badRequest("already said hello")))
        case .ping(let ref):
            send(ServerFrame.pong(ref: ref))
        case .refresh(let ref, let token):
            refresh(ref: ref, token: token)
        case .update(let ref, let id, let u):
            request(ref, user, id) { e throws(StoreError) in
                try e.updateState(user, id: id, u, viewer: v, by: .device(v.device?.deviceId), now: clock.now())
            }
        case .delete(let ref, let id):
            request(ref, user, id) { e throws(StoreError) in
                try e.deleteNotification(user, id: id, viewer: v, by: .device(v.device?.deviceId), now: clock.now())
            }
        case .sync(let ref, let position):
            guard s.queuedSyncCount < Self.maxQueuedSyncs else {
                return send(ServerFrame.error(ref: ref, HeraldError(.rateLimited, "too many sync requests in progress")))
            }
            s.resync(ref: ref, position: position)
        }
    }

    /// Runs `body` (a write to notification `id` of `user`) on the engine and answers `ack` or `error`.
    private func request(_ ref: String?, _ user: UserKey, _ id: String,
                         _ body: @escaping @Sendable (Engine) throws(StoreError) -> Result<WriteAnswer, HeraldError>) {
        // An id of no form the gateway gives names nothing (see NotificationID.isWellFormed).
        guard NotificationID.isWellFormed(id) else { return send(ServerFrame.error(ref: ref, .notFound)) }
        gateway.engine(for: user).perform(on: shard, users: [user], lookups: [.id(user, id)], body) { [self] r in
            switch r.flatMap({ $0 }) {
            case .success(let answer): send(ServerFrame.ack(ref: ref, answer))
            case .failure(let err): send(ServerFrame.error(ref: ref, err))
            }
        }
    }

    private func refresh(ref: String?, token: String) {
        switch gateway.verify(token: token) {
        case .failure(let e):
            send(ServerFrame.error(ref: ref, e))
        case .success(let v):
            let c = v.claims
            guard c.userKey == subscription?.user, c.device == nil || c.device == subscription?.deviceId else {
                return send(ServerFrame.error(ref: ref, HeraldError(.forbidden, "the token is for another app, user or device")))
            }
            tokenExpiresAt = c.expiresAt
            subscription?.signature = v.signature
            scheduleTokenTimers()
            send(ServerFrame.ack(ref: ref, extra: ["expiresAt": .string(RFC3339.format(c.expiresAt * 1000))]))
        }
    }

    /// The token's warning, which arms its expiry: one pending timer per
    /// connection, replaced by a refresh.
    private func scheduleTokenTimers() {
        guard tokenExpiresAt > 0 else { return }
        let exp = tokenExpiresAt * 1000
        shard.cancel(timer)
        timer = shard.schedule(atWall: exp - 60_000) { [weak self] in
            guard let self, self.state == .live else { return }
            self.send(ServerFrame.tokenExpiring(exp))
            self.timer = self.shard.schedule(atWall: exp) { [weak self] in
                guard let self, self.state == .live else { return }
                self.close(.unauthenticated, "token expired", drop: .authExpired)
            }
        }
    }

    // MARK: Output

    private func send(_ frame: [UInt8]) {
        guard state != .closed, closeRequest == nil else { return }
        outbox.append(frame)
        transport.requestWrite()
    }

    public var hasPendingOutput: Bool { !outbox.isEmpty }

    /// Frames what is queued into `out` (up to about `limit` bytes), for the
    /// transport to send.
    public func writePending(into out: inout [UInt8], limit: Int) {
        let before = out.count
        outbox.write(into: &out, limit: limit)
        let tick = gateway.clock.ticks()
        if out.count > before, !outbox.isEmpty { lastDraining = tick }
        writeWaitingSince = outbox.isEmpty ? nil : tick
        if let w = drainWaiter, outbox.bytes < w.below {
            drainWaiter = nil
            w.run()
        }
    }

    // MARK: Closing

    private func fail(_ code: CloseCode, _ e: HeraldError, drop: Metrics.DropReason = .protocolError) {
        send(ServerFrame.error(ref: nil, e))
        close(code, e.message, drop: drop)
    }

    /// Our close code for a client's close frame of `body`: 1000 for an
    /// empty one or a code that may be sent with a UTF-8 reason; 1002 for a
    /// 1-byte body (RFC 6455 5.5.1) or a code not for the wire (7.4: below
    /// 1000, 1004-1006 and 1015 are reserved, 1016-2999 unassigned, 5000
    /// and up undefined); 1007 for a reason that is not UTF-8 (8.1).
    static func answer(toClose body: [UInt8]) -> (code: CloseCode, reason: String) {
        guard !body.isEmpty else { return (.normal, "") }
        guard body.count >= 2 else { return (.protocolError, "a close frame's body is a 2-byte code and a reason") }
        let code = UInt16(body[0]) << 8 | UInt16(body[1])
        switch code {
        case 1000...1003, 1007...1014, 3000...4999: break
        default: return (.protocolError, "close code \(code) is not one to send")
        }
        guard String(validating: body[2...], as: UTF8.self) != nil else { return (.invalidPayload, "the close reason is not UTF-8") }
        return (.normal, "")
    }

    /// `reason` cut to at most 120 bytes (a close frame has room for 123,
    /// RFC 6455 5.5), at a character's first byte: reasons quote client input.
    static func closeReason(_ reason: String) -> String {
        let u = Array(reason.utf8)
        var end = min(u.count, 120)
        while end > 0, end < u.count, u[end] & 0xC0 == 0x80 { end -= 1 }
        return String(decoding: u[..<end], as: UTF8.self)
    }

    /// Closes after what is queued has been written; nothing more is queued.
    func close(_ code: CloseCode, _ reason: String, drop: Metrics.DropReason?) {
        guard closeRequest == nil, state != .closed else { return }
        if let drop, code != .goingAway { gateway.metrics.dropped(drop) }
        closeRequest = (code, Self.closeReason(reason))
        drainWaiter = nil
        subscription?.cancel()
        transport.requestWrite()
    }

    private func scheduleKeepalive(at due: Millis) {
        keepalive = shard.schedule(at: due) { [weak self] in self?.keepaliveDue() }
    }

    private func keepaliveDue() {
        guard state != .closed else { return }
        let limits = gateway.config.limits, tick = gateway.clock.ticks()
        // A socket that took none of the output for `writeTimeoutSeconds`
        // (seen at a keep-alive, so within one ping interval more): the
        // client stopped reading. Live changes past the queue limit wait in
        // the store, so nothing else would end it.
        if outbox.isEmpty {
            writeWaitingSince = nil
        } else if let since = writeWaitingSince, tick - since >= Millis(limits.writeTimeoutSeconds) * 1000 {
            gateway.metrics.dropped(.slowConsumer)
            return transport.hangUp()
        } else if writeWaitingSince == nil {
            writeWaitingSince = tick
        }
        // Heard from, or reading what is sent: a slow reader's pong may wait
        // behind megabytes of changes, and it is not idle meanwhile.
        let active = max(lastHeard, lastDraining)
        let silent = tick - active
        if silent >= Millis(limits.idleHangupSeconds) * 1000 {
            gateway.metrics.dropped(.idle)
            return transport.hangUp()
        }
        if silent >= Millis(limits.pingIntervalSeconds) * 1000 {
            if closeRequest == nil {
                outbox.append(control: WebSocketOutbox.ping, [])
                pingUnanswered = true
                transport.requestWrite()
            }
            return scheduleKeepalive(at: active + Millis(limits.idleHangupSeconds) * 1000)
        }
        scheduleKeepalive(at: active + Millis(limits.pingIntervalSeconds) * 1000)
    }

    /// Gateway shutdown: 1001 to everyone, also those not subscribed yet.
    public func shutdown() { close(.goingAway, "gateway shutting down", drop: nil) }

    /// The transport closed the connection (either side).
    public func transportClosed() {
        state = .closed
        shard.cancel(timer)
        shard.cancel(keepalive)
        outbox.removeAll()
        drainWaiter = nil
        gateway.metrics.connectionClosed(.websocket)
        // Still subscribed: no close handshake ended it (a network loss, a
        // ping timeout), so what was sent last may never have arrived.
        subscription?.cancel(lost: true)
    }
}

extension WebSocketSession: SubscriptionOutput {
    func opened(epoch: String) {}

    func reset(_ page: ResetPage, epoch: String, final: Bool) {
        send(ServerFrame.reset(page.notifications, cursor: page.cursor, epoch: epoch, final: final, preferences: page.preferences))
    }

    func catchUp(_ changes: [EncodedChange], cursor: Int64, more: Bool) {
        send(ServerFrame.changes(changes.map(\.bytes), cursor: cursor))
    }

    func caughtUp(_ purpose: CatchUpPurpose, cursor: Int64, epoch: String, badge: Badge) {
        switch purpose {
        case .subscribe:
            // Made when sent (once per connection): it names the connection
            // to its client only, so no connection keeps it.
            send(ServerFrame.welcome(cursor: cursor, epoch: epoch, connectionId: "c_" + Random.hex(6), badge: badge))
            state = .live
            scheduleTokenTimers()
            let early = waitingForLive
            waitingForLive = []
            for m in early where closeRequest == nil { handle(m) }
        case .sync(let ref):
            send(ServerFrame.ack(ref: ref, extra: ["cursor": .int(cursor)]))
        case .recover:
            break
        }
    }

    func live(_ changes: [EncodedChange], cursor: Int64, badge: Badge?) {
        guard state != .closed, closeRequest == nil else { return }
        for c in changes { outbox.append(live: c) }
        if let badge { outbox.append(ServerFrame.counts(badge)) }
        transport.requestWrite()
    }

    var backlog: Int { outbox.bytes }

    func whenDrained(below bytes: Int, _ f: @escaping () -> Void) {
        if outbox.bytes < bytes { return f() }
        drainWaiter = (bytes, f)
    }

    func ended(_ why: SubscriptionEnd) {
        switch why {
        case .refused(let e): fail(.policy, e, drop: .rateLimited)
        case .failed(let e): fail(.goingAway, e)
        case .deviceDeleted: close(.forbiddenDevice, "device deleted", drop: nil)
        case .revoked: fail(.unauthenticated, .revoked, drop: .authRevoked)
        case .shutdown: shutdown()
        }
    }
}
