import Foundation
import HeraldClient
import Synchronization
import XCTest

/// HeraldClient through what a gateway does to it: a crash mid-burst, a
/// restart that lost its history, a token that runs out while connected.
final class ClientRecoveryTests: ClientTestCase {
    func testTwoDevicesEndWithTheServersSetAfterAGatewayKilledMidBurst() async throws {
        let store = "sqlite:" + directory.appendingPathComponent("herald.db").path
        let first = try GatewayProcess(store: store)
        var gateway = first
        defer { gateway.stop() }
        let user = "frank-\(UUID().uuidString.prefix(8))"
        let (phone, laptop, log) = try await livePhoneAndLaptop(gateway, user: user)

        // The burst talks to whatever answers on the port: `first` only
        // lends it the address, which the restarted gateway takes over.
        let burst = Task { [first, user] in try await ClientRecoveryTests.burst(first, user: user, operations: 300) }
        try await log.eventually("the burst is well under way") { await phone.notifications.count >= 40 }
        gateway.crash()
        gateway = try GatewayProcess(store: store, port: first.port)
        let done = try await burst.value
        XCTAssertEqual(done, 300)

        // The last change of the feed: once both have it, their cursors must be the feed's.
        let last = try await gateway.publishing(user: user, appNotificationId: "last", title: "after the burst")
        try await log.eventually("both are live with the last change", timeout: .seconds(30)) {
            let (p, l) = (await phone.notification(id: last.id), await laptop.notification(id: last.id))
            let (pl, ll) = (await phone.isLive, await laptop.isLive)
            return p != nil && l != nil && pl && ll
        }
        let server = try await gateway.notifications(user: user)
        for (name, device) in [("phone", phone), ("laptop", laptop)] {
            let local = await snapshots(device)
            let cursor = await device.cursor
            XCTAssertEqual(local, server, "\(name) differs from the server")
            XCTAssertEqual(cursor, last.seq, "\(name)'s cursor is not the feed's")
            let events = await log.events(of: name)
            XCTAssertEqual(Self.repeatedChanges(in: events), [], "\(name) applied these more than once")
            let lives = events.filter { if case .connection(.live) = $0 { return true }; return false }
            XCTAssertGreaterThanOrEqual(lives.count, 2, "\(name) did not reconnect by itself")
            await device.stop()
        }
    }

    func testAMemoryGatewayRestartResetsTheClientToTheNewFeed() async throws {
        var gateway = try GatewayProcess()
        defer { gateway.stop() }
        let user = "grace-\(UUID().uuidString.prefix(8))"
        let (phone, log) = try await livePhone(gateway, user: user)
        var lost: Set<String> = []
        for i in 0..<3 { lost.insert(try await gateway.publish(user: user, appNotificationId: "old-\(i)", title: "lost")) }
        try await log.eventually("the first three arrived") { await phone.notifications.count == 3 }
        let oldEpoch = await phone.epoch

        gateway.stop()
        gateway = try GatewayProcess(port: gateway.port)
        var added: Set<String> = []
        for i in 0..<2 { added.insert(try await gateway.publish(user: user, appNotificationId: "new-\(i)", title: "kept")) }
        try await log.eventually("live on the new epoch with what it holds") { [added] in
            let (live, epoch, ids) = (await phone.isLive, await phone.epoch, Set(await phone.notifications.map(\.id)))
            return live && epoch != oldEpoch && ids == added
        }
        let server = try await gateway.notifications(user: user)
        let local = await snapshots(phone)
        XCTAssertEqual(local, server)
        XCTAssert(lost.isDisjoint(with: server.keys))
        let resets = await log.events(of: "phone").filter { if case .reset = $0 { return true }; return false }
        XCTAssertEqual(resets.count, 2, "the first connection's reset and the new epoch's")
        await phone.stop()
    }

    /// Found by an app developer: a gateway restarted with its clients'
    /// tokens refused (4001) left them offline for the backoff they had
    /// reached while it was away, 8 s. The first refusal asks the provider
    /// again at once, whatever the backoff.
    func testARefusedTokenIsReplacedAtOnceHoweverLongTheGatewayWasAway() async throws {
        let first = try GatewayProcess()
        let user = "ivan-\(UUID().uuidString.prefix(8))"
        let good = try await first.token(user: user)
        first.stop()
        let expired = GatewayProcess.mintToken(user: user, exp: Int64(Date().timeIntervalSince1970) - 120)
        let calls = Mutex(0)
        var options = HeraldClient.Options(url: first.baseURL, deviceId: "phone",
                                           stateFile: directory.appendingPathComponent("phone.db").path)
        options.reconnect.initial = .milliseconds(100)
        options.reconnect.cap = .seconds(5)
        let phone = try HeraldClient(options: options, token: { calls.withLock { $0 += 1; return $0 } == 1 ? expired : good })
        let log = EventLog()
        await log.watch(phone, as: "phone")
        await phone.start()
        // Nothing listens: failures in a row raise the backoff to 0.4 s or more.
        try await log.eventually("three attempts failed") {
            await log.events(of: "phone").filter { if case .connection(.offline(nextRetry: .some)) = $0 { return true }; return false }.count >= 3
        }
        let gateway = try GatewayProcess(port: first.port)
        defer { gateway.stop() }
        try await log.eventually("live with the provider's next token") { await phone.isLive }
        let events = await log.timedEvents(of: "phone")
        let refused = try XCTUnwrap(events.firstIndex { if case .problem(.connectionLost(closeCode: 4001, _)) = $0.event { return true }; return false },
                                    "the expired token was not refused")
        let retry = try XCTUnwrap(events[refused...].first { if case .connection(.offline(nextRetry: .some)) = $0.event { return true }; return false })
        guard case .connection(.offline(nextRetry: let at?)) = retry.event else { return XCTFail() }
        XCTAssertLessThanOrEqual(at, retry.at, "the client waited \(at - retry.at) before asking for a fresh token")
        XCTAssertEqual(calls.withLock { $0 }, 2)
        await phone.stop()
    }

    func testATokenExpiringWhileConnectedIsRefreshedWithoutADroppedChange() async throws {
        let gateway = try GatewayProcess()
        defer { gateway.stop() }
        let user = "heidi-\(UUID().uuidString.prefix(8))"
        // The first token has 8 s left (room for a slow start): `tokenExpiring`
        // comes right after `welcome`, and without a refresh the gateway
        // closes 4001 at its exp.
        let lifetime: Int64 = 8
        let short = GatewayProcess.mintToken(user: user, exp: Int64(Date().timeIntervalSince1970) + lifetime)
        let shortEnds = ContinuousClock.now + .seconds(lifetime)
        let long = try await gateway.token(user: user)
        let calls = Mutex(0)
        let (phone, log) = try await livePhone(gateway, user: user, token: {
            calls.withLock { $0 += 1; return $0 } == 1 ? short : long
        })

        // Changes before, during and after the refresh, until the first token is 2 s past its exp.
        var published: Set<String> = []
        var i = 0
        while ContinuousClock.now < shortEnds + .seconds(2) {
            published.insert(try await gateway.publish(user: user, appNotificationId: "around-\(i)", title: "\(i)"))
            i += 1
            try await Task.sleep(for: .milliseconds(100))
        }
        try await log.eventually("every change arrived") { [published] in
            Set(await phone.notifications.map(\.id)) == published
        }
        XCTAssertEqual(calls.withLock { $0 }, 2, "the provider was not asked for the refresh (or asked again)")
        let events = await log.events(of: "phone")
        let connection = events.compactMap { if case .connection(let c) = $0 { return c }; return nil }
        XCTAssertEqual(connection, [.connecting, .live(transport: "websocket")], "the connection did not stay up")
        let problems = events.filter { if case .problem = $0 { return true }; return false }
        XCTAssertEqual(problems, [])
        try await assertLocalEqualsServer(phone, gateway, user: user)
        await phone.stop()
    }

    func testARefreshStillAskingTheProviderWhenTheClientSignsOutLeavesNothingBehind() async throws {
        let gateway = try GatewayProcess()
        defer { gateway.stop() }
        let user = "judy-\(UUID().uuidString.prefix(8))"
        // 8 s left: `tokenExpiring` comes right after `welcome`, and the
        // refresh asks the provider, which answers only once the test lets it.
        let short = GatewayProcess.mintToken(user: user, exp: Int64(Date().timeIntervalSince1970) + 8)
        let long = try await gateway.token(user: user)
        let calls = Mutex(0)
        let held = HeldAnswer()
        let (phone, log) = try await livePhone(gateway, user: user, token: {
            let n = calls.withLock { $0 += 1; return $0 }
            if n == 2 { await held.wait() }
            return n == 1 ? short : long
        })
        await held.untilAsked()
        let signingOut = Task { await phone.signOut() }
        try await log.eventually("the connection closed") {
            await log.events(of: "phone").contains(.connection(.offline(nextRetry: nil)))
        }
        // The refresh was cancelled with the connection; its token comes now.
        await held.release()
        await signingOut.value

        let problems = await log.events(of: "phone").filter { if case .problem = $0 { return true }; return false }
        XCTAssertEqual(problems, [], "the late refresh acted on a client that had stopped")
        // Signed out, the client has no token: a new start asks the provider.
        await phone.start()
        try await log.eventually("live again") {
            await log.events(of: "phone").count { $0 == .connection(.live(transport: "websocket")) } == 2
        }
        XCTAssertEqual(calls.withLock { $0 }, 3)
        await phone.stop()
    }

    func testAProviderThatHandsBackTheExpiringTokenIsNotAskedInALoop() async throws {
        let gateway = try GatewayProcess()
        defer { gateway.stop() }
        let user = "ivan-\(UUID().uuidString.prefix(8))"
        // An app that caches its token until it has expired: the same one
        // until its exp, then a new one. Refreshing with the same token would
        // only have the gateway warn again at once, and again.
        let exp = Int64(Date().timeIntervalSince1970) + 8
        let short = GatewayProcess.mintToken(user: user, exp: exp)
        let long = try await gateway.token(user: user)
        let calls = Mutex(0)
        let (phone, log) = try await livePhone(gateway, user: user, token: {
            calls.withLock { $0 += 1 }
            return Date().timeIntervalSince1970 < Double(exp) ? short : long
        })
        try await log.eventually("back with the new token after the old one's exp", timeout: .seconds(30)) {
            await log.events(of: "phone").count { $0 == .connection(.live(transport: "websocket")) } == 2
        }
        // At start, at the warning (the same token: nothing to send), after the 4001 at exp.
        XCTAssertEqual(calls.withLock { $0 }, 3)
        await phone.stop()
    }

    /// `operations` server API calls in a row: mostly publishes, every
    /// fourth a dismiss and every seventh a delete of an earlier one. A call
    /// that fails because the gateway is down is tried again until it is
    /// answered (404 counts: a delete whose answer the crash swallowed);
    /// answers how many were done.
    private static func burst(_ gateway: GatewayProcess, user: String, operations: Int) async throws -> Int {
        var ids: [String] = []
        let deadline = ContinuousClock.now + .seconds(60)
        for i in 0..<operations {
            // Chosen once: a retried call aims at the same notification.
            let deleting = i % 7 == 6 && ids.count > 3 ? ids.remove(at: ids.count - 3) : nil
            let dismissing = deleting == nil && i % 4 == 3 ? ids.last : nil
            while true {
                do {
                    if let deleting {
                        try await gateway.delete(user: user, id: deleting)
                    } else if let dismissing {
                        try await gateway.dismiss(user: user, id: dismissing)
                    } else {
                        ids.append(try await gateway.publish(user: user, appNotificationId: "burst-\(i)", title: "\(i)"))
                    }
                    break
                } catch let failure as GatewayFailure where failure.status == 404 {
                    break
                } catch {
                    guard ContinuousClock.now < deadline else { throw error }
                    try await Task.sleep(for: .milliseconds(20))  // the gateway is restarting
                }
            }
        }
        return operations
    }

    /// The changes that were applied more than once: an upsert of the same
    /// (id, version) or a removal of the same id, as they were reported.
    private static func repeatedChanges(in events: [HeraldClient.Event]) -> [String] {
        var seen: [String: Int] = [:]
        for event in events {
            switch event {
            case .upserted(let n): seen["upsert \(n.id) v\(n.version)", default: 0] += 1
            case .removed(let id, _): seen["remove \(id)", default: 0] += 1
            default: break
            }
        }
        return seen.filter { $0.value > 1 }.map(\.key).sorted()
    }
}

/// A token provider's answer, held until the test releases it.
private actor HeldAnswer {
    private var released = false, asked = false
    private var waiting: [CheckedContinuation<Void, Never>] = []
    private var askers: [CheckedContinuation<Void, Never>] = []

    /// The provider: blocks until `release`.
    func wait() async {
        asked = true
        for c in askers { c.resume() }
        askers = []
        if released { return }
        await withCheckedContinuation { waiting.append($0) }
    }

    /// The test: returns once the provider waits.
    func untilAsked() async {
        if asked { return }
        await withCheckedContinuation { askers.append($0) }
    }

    func release() {
        released = true
        for c in waiting { c.resume() }
        waiting = []
    }
}
