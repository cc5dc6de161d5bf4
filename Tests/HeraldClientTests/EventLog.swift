import HeraldClient

/// Records the events of the clients it watches, and lets a test wait until
/// a condition holds: checked again after every event, failing at a deadline
/// (never a sleep that hopes something happened meanwhile).
actor EventLog {
    private(set) var events: [(client: String, event: HeraldClient.Event)] = []
    private var waiters: [Int: CheckedContinuation<Void, Never>] = [:]
    private var nextWaiter = 0

    nonisolated func watch(_ client: HeraldClient, as name: String) {
        Task { for await event in client.events { await record(name, event) } }
    }

    /// Watches `client` as `name`, starts it and waits until it is live.
    nonisolated func startLive(_ client: HeraldClient, as name: String) async throws {
        watch(client, as: name)
        await client.start()
        try await eventually("\(name) is live") { await client.isLive }
    }

    func events(of name: String) -> [HeraldClient.Event] { events.filter { $0.client == name }.map(\.event) }

    private func record(_ name: String, _ event: HeraldClient.Event) {
        events.append((name, event))
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
