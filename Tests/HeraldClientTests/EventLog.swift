import HeraldClient

/// Records the events of the clients it watches, and lets a test wait until
/// a condition holds: checked again after every event, failing at a deadline
/// (never a sleep that hopes something happened meanwhile).
actor EventLog {
    private(set) var events: [(client: String, event: HeraldClient.Event, at: ContinuousClock.Instant)] = []
    private var waiters: [Int: CheckedContinuation<Void, Never>] = [:]
    private var nextWaiter = 0

    /// Records what `client` does from now on, and returns once the client
    /// has taken the reader on, so nothing done after this call is missed.
    /// Each stream opens with the state as it is: the connection state at
    /// once, and the first `.reset` and `.unread` whenever the local set is
    /// first shown. Those are left out, so that what a test reads is what
    /// changed.
    nonisolated func watch(_ client: HeraldClient, as name: String) async {
        let (opened, open) = AsyncStream.makeStream(of: Void.self)
        let stream = client.events
        Task {
            var greeted = (connection: false, reset: false, unread: false)
            for await event in stream {
                switch event {
                case .connection where !greeted.connection:
                    greeted.connection = true
                    open.finish()
                case .reset where !greeted.reset: greeted.reset = true
                case .unread where !greeted.unread: greeted.unread = true
                default: await record(name, event)
                }
            }
        }
        for await _ in opened {}
    }

    /// Watches `client` as `name`, starts it and waits until the log has
    /// heard it is live. (The client's state moves before its events reach
    /// the log: waiting for the state alone, a test could read the log
    /// before the catch-up's events were in it.)
    nonisolated func startLive(_ client: HeraldClient, as name: String) async throws {
        await watch(client, as: name)
        await client.start()
        try await eventually("\(name) is live") { await saysLive(name) }
    }

    /// Whether the last connection event of `name` recorded is `.live`:
    /// then every event the client sent before it is recorded too.
    func saysLive(_ name: String) -> Bool {
        for e in events.reversed() where e.client == name {
            if case .connection(let c) = e.event {
                if case .live = c { return true }
                return false
            }
        }
        return false
    }

    func events(of name: String) -> [HeraldClient.Event] { events.filter { $0.client == name }.map(\.event) }

    /// With when each was recorded.
    func timedEvents(of name: String) -> [(event: HeraldClient.Event, at: ContinuousClock.Instant)] {
        events.filter { $0.client == name }.map { ($0.event, $0.at) }
    }

    private func record(_ name: String, _ event: HeraldClient.Event) {
        events.append((name, event, .now))
        let waiting = waiters
        waiters.removeAll()
        for (_, c) in waiting { c.resume() }
    }

    /// Returns once more than `count` events were recorded, or at `deadline`.
    private func waitPast(_ count: Int, until deadline: ContinuousClock.Instant) async {
        guard events.count <= count else { return }
        let id = nextWaiter
        nextWaiter += 1
        await withCheckedContinuation { c in
            waiters[id] = c
            Task { try? await Task.sleep(until: deadline); self.wake(id) }
        }
    }

    private func wake(_ id: Int) { waiters.removeValue(forKey: id)?.resume() }

    private var count: Int { events.count }

    nonisolated func eventually(_ what: String, timeout: Duration = .seconds(15),
                                _ condition: @Sendable () async -> Bool) async throws {
        let deadline = ContinuousClock.now + timeout
        while true {
            let seen = await count
            if await condition() { return }
            guard ContinuousClock.now < deadline else { throw GatewayFailure("timed out waiting until \(what)") }
            await waitPast(seen, until: deadline)
        }
    }
}

extension HeraldClient {
    var isLive: Bool { if case .live = connection { return true }; return false }
}
