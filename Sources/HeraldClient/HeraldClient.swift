import HeraldCore
#if canImport(HeraldClientLWS)
import HeraldClientLWS
#endif

/// A device's connection to a Herald gateway, and its local copy of the
/// user's notifications kept equal to the gateway's (PROTOCOL.md 5–6).
///
/// The local set changes only from what the gateway sends (catch-up, live
/// changes, resets); actions return once the gateway acknowledged them, and
/// their effect arrives as a change like anyone else's. Everything is
/// persisted in `Options.stateFile`, so a new client on the same file
/// resumes from its cursor.
public actor HeraldClient {
    public struct Options: Sendable {
        /// The gateway's base URL: `https://herald.example.com` (or `http://`,
        /// `ws://`, `wss://`); the WebSocket is `/v1/ws` under it.
        public var url: String
        public var deviceId: String
        /// nil keeps what is registered (a new device is `other`).
        public var platform: Platform?
        /// nil keeps what is registered.
        public var tags: [String]?
        /// An SQLite file this client owns (created if absent).
        public var stateFile: String
        public var reconnect = Backoff()
        public var fallback = Fallback()

        public init(url: String, deviceId: String, platform: Platform? = nil, tags: [String]? = nil, stateFile: String) {
            self.url = url; self.deviceId = deviceId; self.platform = platform; self.tags = tags
            self.stateFile = stateFile
        }
    }

    /// Reconnect delays: doubling from `initial` up to `cap`, each drawn at
    /// random from its upper half so that devices dropped together do not
    /// come back together.
    public struct Backoff: Sendable {
        public var initial: Duration = .milliseconds(500)
        public var cap: Duration = .seconds(30)
        public init() {}

        func delay(attempt: Int) -> Duration {
            let ceiling = min(cap, initial * (1 << min(attempt, 30)))
            return ceiling / 2 + ceiling / 2 * Double.random(in: 0...1)
        }
    }

    /// When WebSocket upgrades keep failing (a proxy that refuses them), the
    /// client syncs by long-poll over HTTP, and tries the WebSocket again
    /// every `webSocketRetry`.
    public struct Fallback: Sendable {
        /// Failed upgrades in a row before the client polls.
        public var afterFailures = 2
        public var webSocketRetry: Duration = .seconds(60)
        /// How long the gateway holds each poll (1–60 s); below the idle
        /// timeout of proxies on the way.
        public var pollWait: Duration = .seconds(25)
        public init() {}
    }

    /// Returns a device token for this user (and device), e.g. from the
    /// app's own server. Called at start, when the gateway says the token
    /// expires soon, and after the gateway refused one (close 4001).
    public typealias TokenProvider = @Sendable () async throws -> String

    /// What changed, in order. Each access is a stream of its own, so any
    /// number of readers each see everything. A stream begins with the
    /// state as it is when it opens (`.connection`, and once the first
    /// token said whose the local set is, `.reset` with it and `.unread`),
    /// then every change after: a reader opened late misses nothing it
    /// needs. A reader more than `eventBuffer` events behind is ended (its
    /// loop finishes; open `events` again to start over), so an app that
    /// stops reading does not make the client grow.
    public nonisolated var events: AsyncStream<Event> {
        let (stream, c) = AsyncStream.makeStream(of: Event.self, bufferingPolicy: .bufferingOldest(Self.eventBuffer))
        Task { await addReader(c) }
        return stream
    }
    public static let eventBuffer = 10_000
    private var readers: [Int: AsyncStream<Event>.Continuation] = [:]
    private var nextReader = 0

    private let options: Options
    private let endpoint: Endpoint
    private let transport: any HeraldTransport
    let api: DeviceAPI
    private let tokenProvider: TokenProvider
    let file: StateFile
    private(set) var state: LocalState
    /// The push handle registered (as sent), kept with the state file (`rememberPush`).
    private(set) var registeredPush: String?
    /// Events collected for the `syncOnce` calls running, by call.
    var collectors: [Int: [Event]] = [:]
    var nextCollector = 0
    /// Whose state the file holds: gateway, app, user, device.
    private var scope: String?
    private var token: String?
    private var channel: (any WebSocketChannel)?
    private var pending: [String: CheckedContinuation<JSONObject, any Error>] = [:]
    private var nextRef = 0
    private var runner: Task<Void, Never>?
    /// The refresh asked for by the last `tokenExpiring`, if it still runs.
    private var refresher: Task<Void, Never>?

    /// The gateway's unread count for this device (the local count until
    /// the first `welcome`).
    public var unread: Int { shown ? unreadCount : 0 }
    private var unreadCount: Int
    public private(set) var connection: ConnectionState = .offline(nextRetry: nil)
    public var cursor: Int64? { state.cursor }
    public var epoch: String? { state.epoch }
    /// The local set, newest first, as the gateway orders it. Empty until
    /// the first token says whose it is: a state file left by another user
    /// is cleared before anything of it is shown.
    public var notifications: [HeraldNotification] { shown ? state.sorted : [] }
    public func notification(id: String) -> HeraldNotification? { shown ? state.notifications[id] : nil }
    /// The state file's owner matches the token's (`adoptScope`).
    private(set) var shown = false

    /// libwebsockets where the package links it (Linux, whose URLSession has
    /// no WebSockets); URLSession everywhere else.
    public static var platformTransport: any HeraldTransport {
        #if canImport(HeraldClientLWS)
        LWSTransport()
        #else
        URLSessionTransport()
        #endif
    }

    public init(options: Options, transport: any HeraldTransport = HeraldClient.platformTransport,
                token: @escaping TokenProvider) throws(HeraldClientError) {
        guard let endpoint = Endpoint(baseURL: options.url) else { throw .badURL(options.url) }
        self.options = options
        self.endpoint = endpoint
        self.transport = transport
        api = DeviceAPI(endpoint: endpoint, transport: transport, deviceId: options.deviceId)
        self.tokenProvider = token
        file = try StateFile(path: options.stateFile)
        let saved = try file.load()
        state = saved.state
        scope = saved.scope
        registeredPush = saved.push
        unreadCount = saved.state.unread
    }

    /// Ends the event streams, so readers' loops end with the client.
    deinit { for c in readers.values { c.finish() } }

    /// Connects, and keeps reconnecting until `stop()` (or until the gateway
    /// refuses this device for good: `.problem(.refused)`).
    public func start() {
        guard runner == nil else { return }
        runner = Task { await run() }
    }

    /// Closes the connection; the local state stays for the next start.
    /// Returns once nothing of this run is left, including a token refresh
    /// that was waiting for the provider (its token is then not used).
    public func stop() async {
        let (runner, refresher) = (self.runner, self.refresher)
        (self.runner, self.refresher) = (nil, nil)
        runner?.cancel()
        refresher?.cancel()
        await runner?.value
        await refresher?.value
    }

    /// Stops and forgets everything this device stored.
    public func signOut() async {
        await stop()
        state = LocalState()
        scope = nil
        token = nil
        persist(changedIds: [], replaced: true)
        emit(.reset([]))
        setUnread(0)
        // The next token says whose the (empty) set is.
        shown = false
    }

    // MARK: Actions (answered by the gateway's `ack`)

    // Over the WebSocket while it is live, else over HTTP (PROTOCOL.md 4).

    /// Sets the read, seen and/or action state (read also makes it seen),
    /// and when a snooze ends (`snoozedUntil`, epoch milliseconds: with
    /// `.snoozed`, or alone to move the time of a snoozed one);
    /// `ifVersion` makes it conditional (`.server(code:
    /// "precondition_failed", ...)` when the version moved on).
    @discardableResult
    public func update(_ id: String, readState: ReadState? = nil, seenState: SeenState? = nil,
                       userActionState: UserActionState? = nil, snoozedUntil: Millis? = nil,
                       ifVersion: Int64? = nil) async throws(HeraldClientError) -> HeraldNotification? {
        var fields = JSONObject()
        if let readState { fields["readState"] = .string(readState.rawValue) }
        if let seenState { fields["seenState"] = .string(seenState.rawValue) }
        if let userActionState { fields["userActionState"] = .string(userActionState.rawValue) }
        if let snoozedUntil { fields["snoozedUntil"] = .string(RFC3339.format(snoozedUntil)) }
        guard isWebSocketLive else {
            return try await withAPI { api, token throws(HeraldClientError) in
                try await api.update(token: token, id: id, fields: fields, ifVersion: ifVersion)
            }
        }
        fields["id"] = .string(id)
        if let ifVersion { fields["ifVersion"] = .int(ifVersion) }
        let ack = try await request("update", fields)
        return ack["notification"].flatMap(HeraldNotification.init(json:))
    }

    @discardableResult
    public func markRead(_ id: String, ifVersion: Int64? = nil) async throws(HeraldClientError) -> HeraldNotification? {
        try await update(id, readState: .read, ifVersion: ifVersion)
    }

    @discardableResult
    public func markUnread(_ id: String, ifVersion: Int64? = nil) async throws(HeraldClientError) -> HeraldNotification? {
        try await update(id, readState: .unread, ifVersion: ifVersion)
    }

    /// Seen (shown in the bell or inbox) without reading it.
    @discardableResult
    public func markSeen(_ id: String, ifVersion: Int64? = nil) async throws(HeraldClientError) -> HeraldNotification? {
        try await update(id, seenState: .seen, ifVersion: ifVersion)
    }

    @discardableResult
    public func activate(_ id: String, ifVersion: Int64? = nil) async throws(HeraldClientError) -> HeraldNotification? {
        try await update(id, userActionState: .activated, ifVersion: ifVersion)
    }

    /// Dismisses it and, unless `markRead` is false, marks it read in the
    /// same change: a user who dismisses expects the unread count to drop.
    @discardableResult
    public func dismiss(_ id: String, markRead: Bool = true, ifVersion: Int64? = nil) async throws(HeraldClientError) -> HeraldNotification? {
        try await update(id, readState: markRead ? .read : nil, userActionState: .dismissed, ifVersion: ifVersion)
    }

    /// Snoozes it until `until` (epoch milliseconds, in the future and at
    /// most 365 days ahead), when the gateway wakes it: unread, unseen and
    /// untouched again on every device. Without `until`, snoozed until
    /// something changes it.
    @discardableResult
    public func snooze(_ id: String, until: Millis? = nil, ifVersion: Int64? = nil) async throws(HeraldClientError) -> HeraldNotification? {
        try await update(id, userActionState: .snoozed, snoozedUntil: until, ifVersion: ifVersion)
    }

    /// Deletes the notification for the user on every device. The WebSocket
    /// `delete` takes no `ifVersion` (PROTOCOL.md 6.4).
    public func delete(_ id: String) async throws(HeraldClientError) {
        guard isWebSocketLive else {
            return try await withAPI { api, token throws(HeraldClientError) in try await api.delete(token: token, id: id) }
        }
        var fields = JSONObject()
        fields["id"] = .string(id)
        _ = try await request("delete", fields)
    }

    /// Marks every unread notification this device may see read; answers
    /// how many. Their changes arrive like any other.
    @discardableResult
    public func readAll() async throws(HeraldClientError) -> Int {
        return try await withAPI { api, token throws(HeraldClientError) in try await api.markAll("read-all", token: token) }
    }

    /// Marks every unseen notification this device may see seen (the bell
    /// was opened); answers how many. Their changes arrive like any other.
    @discardableResult
    public func seenAll() async throws(HeraldClientError) -> Int {
        return try await withAPI { api, token throws(HeraldClientError) in try await api.markAll("seen-all", token: token) }
    }

    // MARK: Queries (HTTP, on demand; the local set is `notifications`)

    /// A page of the gateway's history: live notifications this device may
    /// see, newest first, optionally filtered. `limit` 1–500.
    public func history(limit: Int = 50, before: String? = nil, readState: ReadState? = nil,
                        userActionState: UserActionState? = nil) async throws(HeraldClientError) -> HistoryPage {
        return try await withAPI { api, token throws(HeraldClientError) in
            try await api.history(token: token, limit: limit, before: before, readState: readState,
                                  userActionState: userActionState)
        }
    }

    /// The user's preferences as last received (a reset or a save on any
    /// device); nil until then. `fetchPreferences()` asks the gateway.
    public var preferences: Preferences? { shown ? state.preferences : nil }

    /// Asks the gateway for the user's preferences.
    public func fetchPreferences() async throws(HeraldClientError) -> Preferences {
        return try await withAPI { api, token throws(HeraldClientError) in try await api.preferences(token: token) }
    }

    /// Saves preferences for the user on every device (SPEC section 12):
    /// `default` and `groups` replace what is saved when given (nil keeps
    /// it; `[:]` clears the groups); `ifVersion` refuses the save
    /// (`precondition_failed`) unless the saved version is that. Every
    /// device, this one included, receives the save as a change.
    @discardableResult
    public func savePreferences(default d: Channels? = nil, groups: [String: Channels]? = nil,
                                ifVersion: Int64? = nil) async throws(HeraldClientError) -> Preferences {
        let update = Preferences(default: d ?? Channels(), groups: groups ?? [:])
        var body = JSONObject()
        if d != nil { body["default"] = update.json.objectValue?["default"] }
        if groups != nil { body["groups"] = update.json.objectValue?["groups"] }
        return try await withAPI { api, token throws(HeraldClientError) in
            try await api.savePreferences(token: token, body: body, ifVersion: ifVersion)
        }
    }

    public func counts() async throws(HeraldClientError) -> Counts {
        return try await withAPI { api, token throws(HeraldClientError) in try await api.counts(token: token) }
    }

    /// Runs an HTTP call with the current token; a token the gateway
    /// refuses is replaced through the provider once.
    func withAPI<T: Sendable>(_ call: (DeviceAPI, String) async throws(HeraldClientError) -> T) async throws(HeraldClientError) -> T {
        var retried = false
        while true {
            let token = try await validToken()
            do {
                return try await call(api, token)
            } catch .server(code: "unauthorized", let message) {
                if self.token == token { self.token = nil }
                if retried { throw .server(code: "unauthorized", message: message) }
                retried = true
            }
        }
    }

    // MARK: Connection

    private enum Ending {
        /// `opened`: the upgrade was accepted.
        /// `upgradeRefused`: the server answered the upgrade but did not
        /// switch, or switched and dropped the connection before `welcome`.
        case retry(upgradeRefused: Bool, wasLive: Bool, authFailed: Bool)
        case stop
    }

    private func run() async {
        var attempt = 0
        var refusedUpgrades = 0
        /// Tokens refused in a row (close 4001).
        var refusedTokens = 0
        connecting: while !Task.isCancelled {
            // Trying the WebSocket again from a working fallback is no outage.
            if connection != .live(transport: "poll") { setConnection(.connecting) }
            let started = ContinuousClock.now
            guard case .retry(let upgradeRefused, let wasLive, let authFailed) = await connectOnce(), !Task.isCancelled
            else { break connecting }
            // Only a connection that lasted resets the backoff: a gateway
            // that accepts and drops at once must not be hammered.
            if wasLive && ContinuousClock.now - started > .seconds(10) { attempt = 0 }
            // Only refusals count: a gateway that is down (restarting, say)
            // is waited for, not polled for a minute once it is back.
            if upgradeRefused { refusedUpgrades += 1 } else if wasLive { refusedUpgrades = 0 }
            if refusedUpgrades >= options.fallback.afterFailures {
                switch await poll(until: .now + options.fallback.webSocketRetry) {
                case .stop, .refused:
                    break connecting
                case .polled:
                    attempt = 0
                    continue  // time to try the WebSocket again
                case .failed:
                    break  // HTTP fails too: back off as for any failure
                }
            }
            // A refused token is retried at once with a fresh one, however long
            // the gateway was away before (a restarted gateway with a new
            // secret); a fresh one refused too waits as any failure does.
            refusedTokens = authFailed ? refusedTokens + 1 : 0
            let delay = refusedTokens == 1 ? .zero : options.reconnect.delay(attempt: attempt)
            attempt += 1
            setConnection(.offline(nextRetry: .now + delay))
            try? await Task.sleep(for: delay)
        }
        if !Task.isCancelled { runner = nil }  // refused for good: start() may try again
        setConnection(.offline(nextRetry: nil))
    }

    private func connectOnce() async -> Ending {
        let token: String
        do {
            token = try await currentToken()
        } catch {
            emit(.problem(.tokenUnavailable(String(describing: error))))
            return .retry(upgradeRefused: false, wasLive: false, authFailed: false)
        }
        guard !Task.isCancelled else { return .stop }
        let channel = transport.open(endpoint)
        self.channel = channel
        defer { connectionEnded() }
        var wasLive = false, opened = false
        for await event in channel.events {
            switch event {
            case .open:
                opened = true
                channel.send(hello(token: token))
            case .text(let text):
                receive(text)
                wasLive = wasLive || isWebSocketLive
            case .refused(let status, let reason):
                let answer = status.map { " (HTTP \($0))" } ?? ""
                emit(.problem(.connectionLost(closeCode: 1006, reason: "the WebSocket upgrade was refused\(answer): \(reason)")))
                return .retry(upgradeRefused: true, wasLive: false, authFailed: false)
            case .closed(let code, let reason):
                if code == 4003 || code == 1008 {
                    emit(.problem(.refused(closeCode: code, reason: reason)))
                    return .stop
                }
                emit(.problem(.connectionLost(closeCode: code, reason: reason)))
                if code == 4001 { self.token = nil }
                return .retry(upgradeRefused: opened && !wasLive && code != 4001, wasLive: wasLive,
                              authFailed: code == 4001)
            }
        }
        channel.close()  // cancelled by stop()
        return .stop
    }

    private var isLive: Bool { if case .live = connection { return true }; return false }
    private var isWebSocketLive: Bool { connection == .live(transport: "websocket") && channel != nil }

    // MARK: Long-poll fallback

    private enum PollEnding { case polled, failed, refused, stop }

    /// Syncs by `GET /v1/me/sync` with `wait` until `deadline` (the poll
    /// held then may end a little later), applying answers like WebSocket
    /// frames. `.polled` once any poll worked, `.failed` if the first did not.
    private func poll(until deadline: ContinuousClock.Instant) async -> PollEnding {
        var worked = false
        while !Task.isCancelled {
            let (cursor, epoch) = (state.cursor, state.epoch)
            let wait = options.fallback.pollWait
            do {
                let asked = ContinuousClock.now
                let answer = try await withAPI { api, token throws(HeraldClientError) in
                    try await api.sync(token: token, cursor: cursor, epoch: epoch, wait: wait)
                }
                let more = try await apply(answer)
                if !worked {
                    worked = true
                    setConnection(.live(transport: "poll"))
                }
                if !more && ContinuousClock.now >= deadline { return .polled }
                // A front that does not hold polls must not make this a busy loop.
                if !more, case .changes([], _, _, _) = answer, ContinuousClock.now - asked < .seconds(1) {
                    try? await Task.sleep(for: .seconds(1))
                }
            } catch .cancelled {
                return .stop
            } catch .server(code: "forbidden", let message) {
                // As the WebSocket's 4003: the token names another device, or the device was deleted.
                emit(.problem(.refused(closeCode: 4003, reason: message)))
                return .refused
            } catch {
                emit(.problem(error))
                return worked ? .polled : .failed
            }
        }
        return .stop
    }

    /// Applies a sync answer through the same state rules as frames; a
    /// reset's older pages are read from history first, so the local set
    /// is replaced whole. Answers whether more changes are waiting.
    func apply(_ answer: SyncAnswer) async throws(HeraldClientError) -> Bool {
        switch answer {
        case .changes(let changes, let cursor, let epoch, let hasMore):
            apply(.changes(changes, cursor: cursor))
            // Same epoch as sent (another one comes as a reset): taken for a first sync.
            if state.epoch == nil { apply(.welcome(cursor: cursor, epoch: epoch, unread: state.unread)) }
            if state.unread != unreadCount { setUnread(state.unread) }
            return hasMore
        case .reset(var all, var next, let cursor, let epoch, let preferences):
            while let before = next {
                let page = try await withAPI { api, token throws(HeraldClientError) in
                    try await api.history(token: token, limit: 500, before: before, readState: nil, userActionState: nil)
                }
                all += page.notifications
                next = page.next
            }
            apply(.reset(all, cursor: cursor, epoch: epoch, final: true, preferences: preferences))
            setUnread(state.unread)
            return false
        }
    }

    /// Applies the feed part of a frame and persists and reports what it did.
    private func apply(_ frame: ServerFrame) {
        let applied = state.apply(frame)
        if applied.needsSave { persist(changedIds: applied.changedIds, replaced: applied.replaced) }
        applied.events.forEach(emit)
        if applied.epochReplaced { registerPushAgain() }
    }

    /// The token in use, asked of the provider when there is none: the
    /// first one says whose the state file is (`adoptScope`).
    func validToken() async throws(HeraldClientError) -> String {
        do {
            return try await currentToken()
        } catch {
            throw .tokenUnavailable(String(describing: error))
        }
    }

    private func currentToken() async throws -> String {
        if let token { return token }
        let fresh = try await tokenProvider()
        token = fresh
        adoptScope(of: fresh)
        return fresh
    }

    /// A state file saved for another gateway, user or device starts over;
    /// only then is the local set shown. (Internal: tests that feed frames
    /// name the owner without a gateway.)
    func adoptScope(of token: String) {
        let now = "\(endpoint.host):\(endpoint.port)\(endpoint.webSocketPath) \(TokenScope.appAndUser(of: token) ?? "?") \(options.deviceId)"
        if now != scope {
            let hadState = scope != nil
            scope = now
            if hadState {
                state = LocalState()
                unreadCount = 0
                // Registered for the file's former owner, not for this one.
                do { try rememberPush(nil) } catch { emit(.problem(error)) }
            }
            persist(changedIds: [], replaced: hadState)
        }
        guard !shown else { return }
        shown = true
        shownState.forEach(emit)
    }

    /// The push handle now registered, in memory and in the state file.
    func rememberPush(_ sent: String?) throws(HeraldClientError) {
        registeredPush = sent
        try file.savePush(sent)
    }

    /// The gateway lost its history (another epoch), and perhaps this
    /// device's registration with it: the handle is sent again at once. It
    /// is forgotten first, so that if this fails the app's next
    /// `registerPush` sends it.
    func registerPushAgain() {
        guard let sent = registeredPush, let handle = try? JSONParser.parse(Array(sent.utf8)) else { return }
        do { try rememberPush(nil) } catch { return emit(.problem(error)) }
        Task {
            do throws(HeraldClientError) { try await sendPush(handle, as: sent) } catch { emit(.problem(error)) }
        }
    }

    /// What a reader is told the local set is, once it may be shown.
    private var shownState: [Event] { [.reset(state.sorted), .unread(unreadCount)] }

    private func hello(token: String) -> String {
        var o = JSONObject()
        o["type"] = "hello"
        o["token"] = .string(token)
        o["deviceId"] = .string(options.deviceId)
        if let platform = options.platform { o["platform"] = .string(platform.rawValue) }
        if let tags = options.tags { o["tags"] = .array(tags.map(JSON.string)) }
        if let cursor = state.cursor {
            o["cursor"] = .int(cursor)
            if let epoch = state.epoch { o["epoch"] = .string(epoch) }
        }
        return JSON.object(o).encodedString
    }

    private func connectionEnded() {
        channel = nil
        state.connectionEnded()
        let waiting = pending
        pending.removeAll()
        for (_, c) in waiting { c.resume(throwing: HeraldClientError.disconnected) }
    }

    // MARK: Frames

    /// Applies one frame from the gateway. Internal so tests can feed the
    /// client input no gateway would send.
    func receive(_ text: String) {
        let frame: ServerFrame
        switch ServerFrame.parse(text) {
        case .success(let f): frame = f
        case .failure(let error):
            emit(.problem(error))
            return
        }
        apply(frame)
        switch frame {
        case .welcome(_, _, let count):
            setConnection(.live(transport: "websocket"))
            setUnread(count)
        case .counts(let count):
            setUnread(count)
        case .answer(let ref, let body):
            if let ref, let c = pending.removeValue(forKey: ref) { c.resume(returning: body) }
        case .error(let ref, let code, let message):
            let error = HeraldClientError.server(code: code, message: message)
            if let ref, let c = pending.removeValue(forKey: ref) { c.resume(throwing: error) } else { emit(.problem(error)) }
        case .tokenExpiring:
            refresher?.cancel()
            refresher = Task { await refreshToken() }
        case .unknown(let type):
            emit(.problem(.unknownFrame(type: type)))
        case .changes, .reset:
            break
        }
    }

    private func refreshToken() async {
        let inUse = token
        let fresh: String
        do {
            fresh = try await tokenProvider()
        } catch {
            guard !Task.isCancelled else { return }
            return emit(.problem(.tokenUnavailable(String(describing: error))))
        }
        // Stopped (or signed out) while the provider worked: that token
        // belongs to no connection.
        guard !Task.isCancelled else { return }
        // A token that expires no later than the one in use (an app that
        // caches its token hands back the same) is not sent: the gateway
        // would warn again at once, and the client ask again, in a loop until
        // exp. The connection then closes 4001 at exp and the client asks for
        // the next token.
        let later = (TokenScope.expiry(of: fresh) ?? .max) > (inUse.flatMap(TokenScope.expiry) ?? .min)
        guard fresh != inUse, later else { return }
        token = fresh
        do {
            var fields = JSONObject()
            fields["token"] = .string(fresh)
            _ = try await request("refresh", fields)
        } catch {
            // Refused: the connection keeps the old token, and the next
            // connection asks the provider again rather than present this one.
            if case .server = error, token == fresh { token = nil }
            emit(.problem(error))
        }
    }

    private func request(_ type: String, _ fields: JSONObject) async throws(HeraldClientError) -> JSONObject {
        guard isWebSocketLive, let channel else { throw .notConnected }
        nextRef += 1
        let ref = "r\(nextRef)"
        var o = JSONObject()
        o["type"] = .string(type)
        o["ref"] = .string(ref)
        for (key, value) in fields.pairs { o[key] = value }
        let text = JSON.object(o).encodedString
        do {
            return try await withCheckedThrowingContinuation { c in
                pending[ref] = c
                channel.send(text)
            }
        } catch let error as HeraldClientError {
            throw error
        } catch {
            throw .disconnected
        }
    }

    // MARK: Output

    private func persist(changedIds: Set<String>, replaced: Bool) {
        do {
            try file.save(state, scope: scope, changedIds: changedIds, replaced: replaced)
        } catch {
            emit(.problem(error))
        }
    }

    private func addReader(_ c: AsyncStream<Event>.Continuation) {
        let id = nextReader
        nextReader += 1
        readers[id] = c
        c.onTermination = { [weak self] _ in Task { await self?.removeReader(id) } }
        if shown { for e in shownState { c.yield(e) } }
        c.yield(.connection(connection))
    }

    private func removeReader(_ id: Int) { readers[id] = nil }

    private func emit(_ event: Event) {
        // Until the file's owner is known, only what is not its content.
        switch event {
        case .upserted, .removed, .reset:
            guard shown else { return }
            for k in collectors.keys { collectors[k]?.append(event) }
        case .unread, .preferences: guard shown else { return }
        case .connection, .problem: break
        }
        for (id, c) in readers {
            if case .dropped = c.yield(event) {
                c.finish()
                readers[id] = nil
            }
        }
    }

    private func setUnread(_ count: Int) {
        unreadCount = count
        emit(.unread(count))
    }

    private func setConnection(_ state: ConnectionState) {
        guard state != connection else { return }
        connection = state
        emit(.connection(state))
    }
}
