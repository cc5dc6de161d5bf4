import HeraldCore
import HeraldCrypto
import HeraldPorts

/// What a subscription writes to: one adapter per transport (WebSocket,
/// event stream, held poll), as centrifuge's `Transport`. Called on the
/// subscription's loop only.
protocol SubscriptionOutput: AnyObject {
    /// Admitted: the catch-up follows.
    func opened(epoch: String)
    /// One page of a reset, as of `page.cursor`; `final` on the last page
    /// this transport sends (`page.next` then says whether history goes on).
    func reset(_ page: ResetPage, epoch: String, final: Bool)
    /// One page of catch-up changes, bringing the client to `cursor`;
    /// `more` when they stop short of the feed's head.
    func catchUp(_ changes: [EncodedChange], cursor: Int64, more: Bool)
    /// The catch-up is complete at `cursor` (WebSocket: `welcome`, or the
    /// `ack` of a `sync`); live changes follow.
    func caughtUp(_ purpose: CatchUpPurpose, cursor: Int64, epoch: String, badge: Badge)
    /// Live changes (possibly none), and the unread and unseen counts when
    /// either moved.
    func live(_ changes: [EncodedChange], cursor: Int64, badge: Badge?)
    /// Bytes handed to the connection that the client has not taken yet.
    var backlog: Int { get }
    /// Calls `f` once the backlog is below `bytes` (at once if it is now).
    func whenDrained(below bytes: Int, _ f: @escaping () -> Void)
    /// The subscription ended on its own (not after `cancel()`).
    func ended(_ why: SubscriptionEnd)
}

enum CatchUpPurpose: Equatable {
    /// The hello, connect or poll that opened the subscription.
    case subscribe
    /// A WebSocket `sync` message.
    case sync(ref: String?)
    /// Changes may have been missed on the bus: the client sees only the
    /// changes it missed, and its counts if they moved.
    case recover
}

enum SubscriptionEnd {
    /// Over a limit (connections per user): WebSocket 4008, HTTP 429.
    case refused(HeraldError)
    /// The store failed: nothing was sent that is not durable; retry.
    case failed(HeraldError)
    case deviceDeleted
    /// A reload retired the secret of its token, or removed its app.
    case revoked
    case shutdown
}

extension HeraldError {
    static let revoked = HeraldError(.unauthorized, "the token's secret was retired or its app removed")
}

/// One device following one user's feed over any transport: the one owner
/// of the catch-up-then-live hand-over.
///
/// **Invariant**: the client receives every change after its cursor that it
/// may see, in `seq` order, each once (outside answers to `sync`, which may
/// repeat), and `caughtUp` (the WebSocket `welcome`) only after a complete
/// catch-up. How it is kept:
/// 1. Admission (engine thread): the limits, the device's viewer, and the
///    follow: from that batch on every committed change of the user is
///    delivered to this subscription live.
/// 2. Catch-up (reader thread, in pages): each page is read from one store
///    snapshot taken after the follow, and the next page only once the
///    client has read most of what was sent (`whenDrained`), so memory per
///    connection is bounded whatever the history holds. Meanwhile live
///    changes are buffered here.
/// 3. Hand-over: a changes page that reaches its snapshot's head completes
///    the catch-up. Every change after that head committed after the
///    snapshot, hence after the follow: it is in the buffer or still on its
///    way here. Buffered changes at or below the cursor are dropped, the
///    rest go out live, in order. If the buffer outgrew its bound, it was
///    dropped (the store has every change) and only a page read after the
///    drop may complete the catch-up.
/// Changes reach a loop through its FIFO inbox in commit order, so live
/// `seq`s only grow; anything at or below the cursor is dropped.
final class Subscription {
    struct Request: Sendable {
        let user: UserKey
        let deviceId: String?
        /// Where the catch-up begins: read once, when the subscription is made.
        let position: FeedPosition
        let transport: TransportKind
        /// Follows live changes, counted against the per-user connection
        /// limit; false for a poll that is answered at once.
        var follows = true
        var bounds = PageBounds.webSocket
        /// A reset goes out whole (WebSocket), or only its first page (long
        /// poll and event stream: the client pages the rest through history).
        var wholeReset = true
    }

    /// What a subscription keeps of its request for its whole life (every
    /// idle connection carries it: SPEC's scale is memory per connection).
    /// (Fields ordered widest first: Swift lays them out in this order, so
    /// the flags fill what would be padding, here and after it.)
    struct Terms {
        let user: UserKey
        let bounds: PageBounds
        let deviceId: String?
        let transport: TransportKind
        let follows: Bool
        let wholeReset: Bool

        init(_ r: Request) {
            user = r.user; bounds = r.bounds; deviceId = r.deviceId
            transport = r.transport; follows = r.follows; wholeReset = r.wholeReset
        }
    }

    /// The next page is read once less than this is left unread.
    static let drainedBelow = 256 * 1024
    /// Live changes buffered during a catch-up, at most.
    static let bufferLimit = 1 << 20

    let terms: Terms
    // One-byte state next, in the padding after `terms`.
    private enum Phase: UInt8 { case admitting, catchingUp, live, ended }
    private var phase = Phase.admitting
    private var reading = false
    private var awaitingDrain = false
    /// Its follow of the user's feed, held from its admission to its
    /// release; nil for a poll answered at once, and once released.
    private var follow: Follow?
    var user: UserKey { terms.user }
    var deviceId: String? { terms.deviceId }
    private let gateway: Gateway
    private let shard: Shard
    private var output: SubscriptionOutput?
    /// Of the token that opened it, or of the one a WebSocket `refresh` put
    /// in its place.
    var signature: TokenSignature

    private var purpose = CatchUpPurpose.subscribe
    private var step: CatchUpStep
    private var readSerial = 0
    /// Pages read up to this serial may not complete the catch-up (the
    /// buffer was dropped while they were on their way).
    private var taintedThrough = 0
    private var buffered: [ChangeRecord] = []
    private var bufferedBytes = 0
    private var queuedSyncs: [(ref: String?, position: FeedPosition)] = []
    /// The last live change sent, and when (a tick): what a tap says if the
    /// connection is lost soon after (`cancel(lost:)`). No payload is kept.
    private var lastSent: LostChange?

    /// The feed position the client has been brought to.
    private(set) var cursor: Int64 = 0
    private(set) var viewer = Viewer.unnamed
    private(set) var epoch = ""
    private var badge = Badge.zero

    init(_ request: Request, signature: TokenSignature, gateway: Gateway, shard: Shard, output: SubscriptionOutput) {
        terms = Terms(request); self.signature = signature; self.gateway = gateway; self.shard = shard; self.output = output
        step = .begin(request.position)
    }

    // MARK: Admission

    /// `registration`: what a WebSocket's `hello` registers for its device.
    func start(registering registration: DeviceRegistration? = nil) {
        shard.thread.preconditionCurrent()
        let r = terms, index = shard.index, now = gateway.clock.now()
        gateway.engine(for: r.user).perform(on: shard, users: [r.user], lookups: NotificationLookup.registering(registration, for: r.user), { e throws(StoreError) in
            try e.admit(r, registering: registration, shard: index, now: now)
        }) { [self] result in
            switch result {
            case .failure(let err): end(.failed(err))
            case .success(.refused(let err)): end(.refused(err))
            case .success(.admitted(let v, let e, let f)): admitted(viewer: v, epoch: e, follow: f)
            }
        }
    }

    private func admitted(viewer v: Viewer, epoch e: String, follow f: Follow?) {
        follow = f
        // Ended while admitting: the follow is given back at once.
        guard phase == .admitting else { return release() }
        // Admitted after shutdown began: nothing may start now.
        guard !shard.isShuttingDown else { return end(.shutdown) }
        // Its token was checked before a reload whose sweep of this shard
        // (`endRevoked`) may have run while it was not in the shard yet.
        guard tokenHolds(in: gateway.apps) else { return end(.revoked) }
        viewer = v
        epoch = e
        if follow != nil { shard.add(self) }
        phase = .catchingUp
        output?.opened(epoch: e)
        readWhenDrained()
    }

    // MARK: Catch-up

    /// A WebSocket `sync`: the catch-up again from `position`, then `ack`.
    func resync(ref: String?, position: FeedPosition) {
        switch phase {
        case .live:
            purpose = .sync(ref: ref)
            step = .begin(position)
            phase = .catchingUp
            readWhenDrained()
        case .admitting, .catchingUp:
            queuedSyncs.append((ref, position))
        case .ended:
            break
        }
    }

    var queuedSyncCount: Int { queuedSyncs.count }

    /// Changes may have been missed on their way here (a gap in the user's
    /// seqs from the bus, a resubscribed bus), or were too many to queue
    /// (`deliverLive`): read them from the store, as a `sync` would, before
    /// delivering more. Taken after those changes committed, the next
    /// page's snapshot holds them.
    func recover() {
        switch phase {
        case .live:
            purpose = .recover
            step = .changes(after: cursor)
            phase = .catchingUp
            readWhenDrained()
        case .catchingUp:
            // A page in flight may predate what was missed.
            taintedThrough = readSerial
        case .admitting, .ended:
            break  // its first page is read later
        }
    }

    private func readWhenDrained() {
        guard phase == .catchingUp, !reading, !awaitingDrain, let output else { return }
        guard output.backlog < Self.drainedBelow else {
            awaitingDrain = true
            return output.whenDrained(below: Self.drainedBelow) { [weak self] in
                self?.awaitingDrain = false
                self?.readWhenDrained()
            }
        }
        reading = true
        readSerial += 1
        let serial = readSerial, user = self.user, v = viewer, e = epoch, s = step, b = terms.bounds
        let critical = gateway.apps[user.app]?.criticalGroups ?? []
        gateway.reads.read(on: shard, of: user, { st throws(StoreError) in
            try st.catchUpPage(user, viewer: v, epoch: e, step: s, bounds: b, critical: critical)
        }) { [self] result in
            reading = false
            guard phase == .catchingUp else { return }
            switch result {
            case .failure(let err): end(.failed(err))
            case .success(let page): apply(page, serial: serial)
            }
        }
    }

    private func apply(_ page: CatchUpPage, serial: Int) {
        switch page {
        case .reset(let p):
            let final = p.next == nil || !terms.wholeReset
            cursor = p.cursor
            dropBuffered()
            step = final ? .changes(after: p.cursor) : .reset(after: p.next!, cursor: p.cursor)
            output?.reset(p, epoch: epoch, final: final)
        case .changes(let p):
            cursor = p.reached
            dropBuffered()
            step = .changes(after: p.reached)
            if !p.items.isEmpty { output?.catchUp(p.items, cursor: p.reached, more: !p.complete) }
            if let b = p.badge, serial > taintedThrough, phase == .catchingUp { return handOver(badge: b) }
        }
        readWhenDrained()
    }

    private func handOver(badge b: Badge) {
        let was = badge
        badge = b
        phase = .live
        let pending = buffered
        buffered = []
        bufferedBytes = 0
        output?.caughtUp(purpose, cursor: cursor, epoch: epoch, badge: b)
        guard follow != nil else { return }  // a poll answered at once: nothing live follows
        // A sync held back until welcome may have started a new catch-up:
        // then the changes still wait for it.
        guard phase == .live else { return buffer(pending) }
        if purpose != .subscribe, b != was { output?.live([], cursor: cursor, badge: b) }
        if !pending.isEmpty { deliverLive(pending, judged: false) }
        if phase == .live, !queuedSyncs.isEmpty {
            let next = queuedSyncs.removeFirst()
            resync(ref: next.ref, position: next.position)
        }
    }

    private func dropBuffered() {
        let n = buffered.prefix { $0.seq <= cursor }.count
        guard n > 0 else { return }
        bufferedBytes -= buffered[..<n].reduce(0) { $0 + $1.encoded.count }
        buffered.removeFirst(n)
    }

    // MARK: Live

    /// Changes committed after the follow, in seq order (from the shard).
    func deliver(_ records: [ChangeRecord]) {
        switch phase {
        case .live: deliverLive(records)
        case .catchingUp: buffer(records)
        case .admitting, .ended: break
        }
    }

    private func buffer(_ records: [ChangeRecord]) {
        for r in records where r.seq > max(cursor, buffered.last?.seq ?? 0) {
            buffered.append(r)
            bufferedBytes += r.encoded.count
        }
        if bufferedBytes > Self.bufferLimit {
            // The store has them all: drop the copies; only a page read
            // from now on may complete the catch-up.
            buffered = []
            bufferedBytes = 0
            taintedThrough = readSerial
        }
    }

    /// `judged`: whether the per-connection limit applies (not to what the
    /// catch-up buffered, which the client could not have read yet).
    ///
    /// Changes that would take the unsent data past the limit are not
    /// queued: the connection catches up from the store instead, a page at
    /// a time as the client reads, like after a missed record. One commit
    /// can carry many megabytes for one user (a read-all over large
    /// notifications, a burst of 64 KiB publishes), and closing a client
    /// that was keeping up would only make it catch up anyway. A client
    /// that takes nothing is closed by the write timeout (HTTPConnection,
    /// WebSocketSession.keepaliveDue).
    private func deliverLive(_ records: [ChangeRecord], judged: Bool = true) {
        guard let output else { return }
        var items: [EncodedChange] = []
        var delta = Badge.zero, reached = cursor, bytes = 0
        for r in records where r.seq > reached {
            reached = r.seq
            delta += r.badgeDelta(for: viewer)
            if let b = r.bytes(for: viewer) {
                items.append(EncodedChange(seq: r.seq, bytes: b))
                bytes += b.count
            }
        }
        if judged, phase == .live, output.backlog + bytes > gateway.config.limits.maxQueuedBytesPerConnection {
            gateway.metrics.deferredBursts.add(1, ordering: .relaxed)
            return recover()  // its pages are read after these changes committed
        }
        cursor = reached
        guard !items.isEmpty || !delta.isZero else { return }
        badge += delta
        if !items.isEmpty {
            gateway.metrics.deliveries.add(items.count, ordering: .relaxed)
            if let r = records.last(where: { $0.seq == items.last!.seq }) {
                lastSent = LostChange(r, at: gateway.clock.ticks()) ?? lastSent
            }
        }
        output.live(items, cursor: cursor, badge: delta.isZero ? nil : badge)
    }

    func viewerChanged(_ v: Viewer) { viewer = v }

    /// Whether its token still verifies with `apps`.
    func tokenHolds(in apps: [String: AppConfig]) -> Bool {
        signature.holds(with: apps[user.app]?.tokenSecrets ?? [])
    }

    // MARK: Ending

    /// Ends the subscription and tells its output why.
    func end(_ why: SubscriptionEnd) {
        finish()?.ended(why)
    }

    /// The connection went away, or the output is done (a poll answered).
    /// `lost`: it went without a close handshake, just after a change went
    /// to it maybe (SPEC section 10: the device then gets a tap).
    func cancel(lost: Bool = false) {
        let tap = lost && phase != .ended ? lastSent.flatMap { gateway.clock.ticks() - $0.at <= Self.lossWindow ? $0 : nil } : nil
        _ = finish()
        // After the release `finish` queued: the device counts as gone by then.
        if let tap, let device = deviceId {
            let user = self.user, epoch = self.epoch
            gateway.engine(for: user).write(users: [user], taken: { _ in }) { e throws(StoreError) in try e.push.tapAfterLoss(e.tx, user, device, tap, epoch: epoch) }
        }
    }

    /// How recent a change sent to a connection that was lost must be for a tap.
    static let lossWindow: Millis = 60_000

    private func finish() -> SubscriptionOutput? {
        guard phase != .ended else { return nil }
        phase = .ended
        buffered = []
        queuedSyncs = []
        let o = output
        output = nil
        // Still admitting: the admission's reply releases what it registered.
        release()
        return o
    }

    private func release() {
        guard let f = follow else { return }
        follow = nil
        shard.remove(self)
        gateway.engine(for: user).release { e in e.registry.release(f, now: e.clock.now()) }
    }
}

enum Admission: Sendable {
    /// `follow`: for a follower, what its subscription holds until it releases it.
    case admitted(Viewer, epoch: String, follow: Follow?)
    case refused(HeraldError)
}

extension Engine {
    /// Admits a subscription: the per-user limit, the device's viewer and,
    /// for a follower, the follow. The follow counts from this batch on:
    /// changes committed after it are delivered to the shard.
    func admit(_ r: Subscription.Terms, registering registration: DeviceRegistration?, shard: Int, now: Millis) throws(StoreError) -> Admission {
        if r.follows, registry.followers(of: r.user) >= limits.maxConnectionsPerUser {
            return .refused(HeraldError(.rateLimited, "this user has reached its limit of \(limits.maxConnectionsPerUser) open connections",
                                        retryAfterSeconds: 5))
        }
        let v: Viewer
        switch try registerViewer(r.user, deviceId: r.deviceId, registration: registration, now: now) {
        case .failure(let e): return .refused(e)
        case .success(let viewer): v = viewer
        }
        var follow: Follow?
        if r.follows {
            let head = bus != nil && registry.followers(of: r.user) == 0 ? try reads.feed(r.user).head : nil
            follow = tx.admit(Follow(user: r.user, shard: shard, device: r.deviceId, transport: r.transport), head: head, now: now)
        } else {
            registry.polled(r.user, device: r.deviceId, now: now)
        }
        return .admitted(v, epoch: v.epoch(store: reads.epoch), follow: follow)
    }
}
