import HeraldCore
import HeraldCrypto
import HeraldPorts

/// Long-poll sync and Server-Sent Events (SPEC section 4) for devices that
/// cannot hold a WebSocket: both are outputs of a `Subscription`, so they
/// resume from a cursor with the same hand-over as WebSockets.
extension Gateway {
    static let keepAliveMillis: Millis = 15_000

    /// `GET /v1/me/events` (`events`) or `GET /v1/me/sync`.
    func fallback(events: Bool, _ c: Call, _ d: DeviceContext) throws(HeraldError) {
        let req = c.req, shard = c.x.shard, responder = c.x.responder
        let epoch = req.queryValue("epoch")
        if let epoch, epoch.utf8.count > 128 { throw HeraldError.badRequest("epoch is longer than 128 bytes") }
        var position = FeedPosition(cursor: nil, epoch: epoch)
        // An event stream's Last-Event-ID (EventSource resuming) wins over ?cursor=.
        if events, let last = req.headers["last-event-id"], !last.isEmpty {
            position.cursor = try Self.cursor(last, "Last-Event-ID")
        } else if let cursor = req.queryValue("cursor") {
            position.cursor = try Self.cursor(cursor, "cursor")
        }
        if events {
            var r = Subscription.Request(user: d.user, deviceId: d.deviceId, position: position, transport: .sse)
            r.wholeReset = false
            return EventStream(gateway: self, shard: shard, responder: responder, tokenExpiresAt: d.claims.expiresAt * 1000)
                .start(r, signature: d.signature)
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
        var r = Subscription.Request(user: d.user, deviceId: d.deviceId, position: position, transport: .poll)
        r.follows = wait > 0
        r.wholeReset = false
        r.bounds = PageBounds(items: limit, bytes: HeldPoll.maxBytes)
        HeldPoll(gateway: self, shard: shard, responder: responder, limit: limit, waitSeconds: wait).start(r, signature: d.signature)
    }

    static func cursor(_ s: String, _ name: String) throws(HeraldError) -> Int64 {
        guard let v = Int64(s), v >= 0 else { throw HeraldError.badRequest("\(name) must be a non-negative integer") }
        return v
    }
}

/// Bodies of `GET /v1/me/sync`, with changes and notifications spliced in
/// already encoded.
enum SyncBody {
    static func changes(_ encoded: [[UInt8]], cursor: Int64, epoch: String, hasMore: Bool) -> [UInt8] {
        var out = Array(#"{"changes":"#.utf8)
        ServerFrame.appendArray(encoded, to: &out)
        out.append(contentsOf: ",\"cursor\":\(cursor),\"epoch\":".utf8)
        JSON.encodeString(epoch, into: &out)
        out.append(contentsOf: ",\"hasMore\":\(hasMore)}".utf8)
        return out
    }

    static func reset(_ page: ResetPage, epoch: String) -> [UInt8] {
        var out = Array(#"{"reset":true,"notifications":"#.utf8)
        ServerFrame.appendArray(page.notifications, to: &out)
        out.append(contentsOf: ",\"next\":".utf8)
        if let next = page.next { JSON.encodeString(PageToken.encode(next), into: &out) } else { out.append(contentsOf: "null".utf8) }
        out.append(contentsOf: ",\"cursor\":\(page.cursor),\"epoch\":".utf8)
        JSON.encodeString(epoch, into: &out)
        out.append(contentsOf: ",\"preferences\":".utf8)
        out.append(contentsOf: page.preferences)
        out.append(UInt8(ascii: "}"))
        return out
    }
}

/// A `sync` request: answered with the first catch-up page, or, when there
/// is nothing after its cursor and it may wait, held until a change it may
/// see or its deadline.
final class HeldPoll: SubscriptionOutput {
    /// A poll answer carries about this much past its first change.
    static let maxBytes = 1 << 20

    private let gateway: Gateway
    private let shard: Shard
    private let responder: HTTPResponder
    private let limit: Int
    private let waitSeconds: Int
    private var subscription: Subscription?
    private var epoch = ""
    private var held = false
    private var answered = false
    private var deadline: Shard.TimerID?

    init(gateway: Gateway, shard: Shard, responder: HTTPResponder, limit: Int, waitSeconds: Int) {
        self.gateway = gateway; self.shard = shard; self.responder = responder; self.limit = limit; self.waitSeconds = waitSeconds
    }

    func start(_ r: Subscription.Request, signature: TokenSignature) {
        let s = Subscription(r, signature: signature, gateway: gateway, shard: shard, output: self)
        subscription = s
        responder.onClose { [weak self] in self?.finish() }
        s.start()
    }

    private func answer(_ r: HTTPResponse) {
        guard !answered else { return }
        responder.respond(r)
        finish()
    }

    private func answer(_ changes: [[UInt8]], cursor: Int64, more: Bool) {
        answer(HTTPResponse(status: 200, body: SyncBody.changes(changes, cursor: cursor, epoch: epoch, hasMore: more)))
    }

    private func finish() {
        guard !answered else { return }
        answered = true
        shard.cancel(deadline)
        if held {
            gateway.heldPolls.subtract(1, ordering: .relaxed)
            gateway.metrics.connectionClosed(.poll)
        }
        subscription?.cancel()
    }

    func opened(epoch: String) { self.epoch = epoch }

    func reset(_ page: ResetPage, epoch: String, final: Bool) {
        answer(HTTPResponse(status: 200, body: SyncBody.reset(page, epoch: epoch)))
    }

    func catchUp(_ changes: [EncodedChange], cursor: Int64, more: Bool) {
        answer(changes.map(\.bytes), cursor: cursor, more: more)
    }

    func caughtUp(_ purpose: CatchUpPurpose, cursor: Int64, epoch: String, badge: Badge) {
        guard purpose != .recover else { return }  // held already
        guard waitSeconds > 0 else { return answer([], cursor: cursor, more: false) }
        guard gateway.holdPoll() else {
            return answer(.error(HeraldError(.rateLimited, "too many held polls; retry shortly", retryAfterSeconds: 1)))
        }
        held = true
        gateway.metrics.connectionOpened(.poll)
        deadline = shard.schedule(at: gateway.clock.ticks() + Millis(waitSeconds) * 1000) { [weak self] in self?.answerEmpty() }
    }

    private func answerEmpty() {
        guard let s = subscription else { return }
        answer([], cursor: s.cursor, more: false)
    }

    /// At most a page of them, as a catch-up page would be (`limit`, and
    /// about `maxBytes`): the rest are the next poll's, from the store.
    func live(_ changes: [EncodedChange], cursor: Int64, badge: Badge?) {
        guard !changes.isEmpty else { return }
        let taken = changes.prefix(PageBounds(items: limit, bytes: Self.maxBytes).fitting(changes))
        let more = taken.count < changes.count
        answer(taken.map(\.bytes), cursor: more ? taken.last!.seq : cursor, more: more)
    }

    var backlog: Int { 0 }

    func whenDrained(below bytes: Int, _ f: @escaping () -> Void) { f() }

    func ended(_ why: SubscriptionEnd) {
        switch why {
        case .refused(let e), .failed(let e): answer(.error(e))
        case .revoked: answer(.error(.revoked))
        case .deviceDeleted, .shutdown:
            // A held poll is answered empty; one still catching up is told to retry.
            held ? answerEmpty() : answer(.error(HeraldError.shuttingDown))
        }
    }
}

/// A Server-Sent Events stream: one `change` event per change, `id:` its
/// seq; it starts with a `reset` event when the cursor is unusable.
final class EventStream: SubscriptionOutput {
    private let gateway: Gateway
    private let shard: Shard
    private let responder: HTTPResponder
    private let tokenExpiresAt: Millis
    private var subscription: Subscription?
    private var streaming = false
    private var done = false
    private var expiry: Shard.TimerID?
    private var nextKeepAlive: Shard.TimerID?

    init(gateway: Gateway, shard: Shard, responder: HTTPResponder, tokenExpiresAt: Millis) {
        self.gateway = gateway; self.shard = shard; self.responder = responder; self.tokenExpiresAt = tokenExpiresAt
    }

    static func event(id: Int64, name: String, data: [UInt8]) -> [UInt8] {
        Array("id: \(id)\nevent: \(name)\ndata: ".utf8) + data + [0x0A, 0x0A]
    }

    func start(_ r: Subscription.Request, signature: TokenSignature) {
        let s = Subscription(r, signature: signature, gateway: gateway, shard: shard, output: self)
        subscription = s
        responder.onClose { [weak self] in self?.finish(closing: false) }
        s.start()
    }

    /// Ends the stream after what is queued (closing the connection).
    private func finish(closing: Bool = true) {
        guard !done else { return }
        done = true
        shard.cancel(expiry)
        shard.cancel(nextKeepAlive)
        if streaming {
            if closing { responder.finish() }
            gateway.metrics.connectionClosed(.sse)
        }
        subscription?.cancel()
    }

    func opened(epoch: String) {
        streaming = true
        gateway.metrics.connectionOpened(.sse)
        responder.startStream(contentType: "text/event-stream", headers: [("Cache-Control", "no-cache"), ("X-Accel-Buffering", "no")])
        // The stream ends when its token expires; EventSource then
        // reconnects, with a fresh token in its URL.
        expiry = shard.schedule(atWall: tokenExpiresAt) { [weak self] in
            guard let self, !self.done else { return }
            self.gateway.metrics.dropped(.authExpired)
            self.finish()
        }
        keepAlive()
    }

    private func keepAlive() {
        nextKeepAlive = shard.schedule(at: gateway.clock.ticks() + Gateway.keepAliveMillis) { [weak self] in
            guard let self, !self.done else { return }
            self.responder.send(Array(": keep-alive\n\n".utf8))
            self.keepAlive()
        }
    }

    func reset(_ page: ResetPage, epoch: String, final: Bool) {
        responder.send(Self.event(id: page.cursor, name: "reset", data: SyncBody.reset(page, epoch: epoch)))
    }

    func catchUp(_ changes: [EncodedChange], cursor: Int64, more: Bool) { send(changes) }

    func caughtUp(_ purpose: CatchUpPurpose, cursor: Int64, epoch: String, badge: Badge) {}

    func live(_ changes: [EncodedChange], cursor: Int64, badge: Badge?) { send(changes) }

    private func send(_ changes: [EncodedChange]) {
        guard !done, !changes.isEmpty else { return }
        var out: [UInt8] = []
        for c in changes { out += Self.event(id: c.seq, name: "change", data: c.bytes) }
        responder.send(out)
    }

    var backlog: Int { responder.queuedBytes }

    func whenDrained(below bytes: Int, _ f: @escaping () -> Void) { responder.whenDrained(below: bytes, f) }

    func ended(_ why: SubscriptionEnd) {
        switch why {
        case .refused(let e) where !streaming, .failed(let e) where !streaming:
            done = true
            responder.respond(.error(e))
        case .shutdown where !streaming:
            done = true
            responder.respond(.error(HeraldError.shuttingDown))
        case .revoked where !streaming:
            done = true
            responder.respond(.error(.revoked))
        case .revoked:
            gateway.metrics.dropped(.authRevoked)
            finish()
        default:
            finish()
        }
    }
}
