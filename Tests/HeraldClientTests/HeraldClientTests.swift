import Foundation
@testable import HeraldClient
import HeraldClientLWS
import Observation
import Synchronization
import XCTest

/// HeraldClient against a real gateway process (memory store).
final class HeraldClientTests: ClientTestCase {
    func testPublishAndDismissReachEveryDeviceOfTheUser() async throws {
        let gateway = try GatewayProcess()
        defer { gateway.stop() }
        let user = "alice-\(UUID().uuidString.prefix(8))"
        let phone = try await client(gateway, user: user, device: "phone", platform: .ios, file: "phone.db")
        let laptop = try await client(gateway, user: user, device: "laptop", platform: .web, file: "laptop.db")
        let log = EventLog()
        await log.watch(phone, as: "phone")
        await log.watch(laptop, as: "laptop")
        await phone.start()
        await laptop.start()
        try await log.eventually("both are live") {
            let (p, l) = (await phone.isLive, await laptop.isLive)
            return p && l
        }

        let id = try await gateway.publish(user: user, appNotificationId: "task-1", title: "Review the draft")
        try await log.eventually("both have the notification") {
            let (p, l) = (await phone.notification(id: id), await laptop.notification(id: id))
            return p != nil && l != nil
        }
        try await log.eventually("both count it unread") {
            let (p, l) = (await phone.unread, await laptop.unread)
            return p == 1 && l == 1
        }

        let acked = try await phone.dismiss(id, ifVersion: 1)
        XCTAssertEqual(acked?.userActionState, .dismissed)
        XCTAssertEqual(acked?.readState, .read, "a dismiss also marks it read: the badge drops")
        XCTAssertEqual(acked?.version, 2)
        try await log.eventually("both count nothing unread") {
            let (p, l) = (await phone.unread, await laptop.unread)
            return p == 0 && l == 0
        }
        try await log.eventually("both see the dismiss") {
            let (p, l) = (await phone.notification(id: id), await laptop.notification(id: id))
            return p?.userActionState == .dismissed && l?.userActionState == .dismissed
        }
        let server = try await gateway.notifications(user: user)
        let phoneState = await snapshots(phone)
        let laptopState = await snapshots(laptop)
        XCTAssertEqual(phoneState, server)
        XCTAssertEqual(laptopState, server)

        // A stale version is refused with the gateway's code; nothing changes.
        do {
            try await laptop.markRead(id, ifVersion: 1)
            XCTFail("a stale ifVersion was accepted")
        } catch {
            guard case .server(let code, _) = error else { return XCTFail("unexpected \(error)") }
            XCTAssertEqual(code, "precondition_failed")
        }
        let laptopAfter = await snapshots(laptop)
        XCTAssertEqual(laptopAfter, server)

        await phone.stop()
        await laptop.stop()
    }

    func testADismissCanLeaveTheNotificationUnread() async throws {
        let gateway = try GatewayProcess()
        defer { gateway.stop() }
        let user = "bea-\(UUID().uuidString.prefix(8))"
        let phone = try await client(gateway, user: user, device: "phone", file: "phone.db")
        let id = try await gateway.publish(user: user, appNotificationId: "later", title: "Read it later")
        // Over HTTP: the client was not started.
        let acked = try await phone.dismiss(id, markRead: false)
        XCTAssertEqual(acked?.userActionState, .dismissed)
        XCTAssertEqual(acked?.readState, .unread)
        let server = try await gateway.notifications(user: user)
        XCTAssertEqual(server[id], Snapshot(version: 2, readState: "unread", userActionState: "dismissed"))
    }

    func testAStateFileOfAnotherUserIsClearedBeforeAnythingOfItIsShown() async throws {
        let gateway = try GatewayProcess()
        defer { gateway.stop() }
        let (alice, bob) = ("alice-\(UUID().uuidString.prefix(8))", "bob-\(UUID().uuidString.prefix(8))")
        let hers = try await gateway.publish(user: alice, appNotificationId: "private", title: "Alice's")
        let his = try await gateway.publish(user: bob, appNotificationId: "mine", title: "Bob's")
        let first = try await client(gateway, user: alice, device: "phone", file: "shared.db")
        let log = EventLog()
        try await log.startLive(first, as: "alice")
        try await log.eventually("alice has hers") { await first.notification(id: hers) != nil }
        await first.stop()

        // Bob signs in on the same device, on the same file.
        let second = try await client(gateway, user: bob, device: "phone", file: "shared.db")
        let shown = await second.notifications
        let unread = await second.unread
        let byId = await second.notification(id: hers)
        XCTAssertEqual(shown, [], "nothing of the file shows before a token says whose it is")
        XCTAssertEqual(unread, 0)
        XCTAssertNil(byId)
        let seen = Mutex<[HeraldClient.Event]>([])
        let stream = second.events
        let reader = Task { for await e in stream { seen.withLock { $0.append(e) } } }
        try await log.startLive(second, as: "bob")
        try await log.eventually("bob has his") { await second.notification(id: his) != nil }
        await second.stop()
        reader.cancel()
        let ids = seen.withLock { events in
            events.flatMap { e -> [String] in
                switch e {
                case .upserted(let n): [n.id]
                case .reset(let list): list.map(\.id)
                default: []
                }
            }
        }
        XCTAssertFalse(ids.contains(hers), "an event showed alice's notification to bob")
        try await assertLocalEqualsServer(second, gateway, user: bob)
    }

    func testEachReaderOfEventsSeesEveryEvent() async throws {
        let gateway = try GatewayProcess()
        defer { gateway.stop() }
        let user = "cleo-\(UUID().uuidString.prefix(8))"
        let phone = try await client(gateway, user: user, device: "phone", file: "phone.db")
        let (one, two) = (EventLog(), EventLog())
        await one.watch(phone, as: "phone")
        try await two.startLive(phone, as: "phone")
        var ids: [String] = []
        for i in 0..<5 { ids.append(try await gateway.publish(user: user, appNotificationId: "n\(i)", title: "\(i)")) }
        for log in [one, two] {
            try await log.eventually("every reader has all five") { [ids] in
                Set(await log.events(of: "phone").compactMap { if case .upserted(let n) = $0 { return n.id }; return nil }) == Set(ids)
            }
        }
        try await two.eventually("all five counted") { await phone.unread == 5 }
        // A reader opened now starts from the state as it is.
        var late = phone.events.makeAsyncIterator()
        guard case .reset(let list)? = await late.next() else { return XCTFail("a late reader did not start with the set") }
        XCTAssertEqual(Set(list.map(\.id)), Set(ids))
        guard case .unread(5)? = await late.next() else { return XCTFail("a late reader did not get the count") }
        await phone.stop()
    }

    func testARestartedClientResumesFromItsCursorWithoutAReset() async throws {
        let gateway = try GatewayProcess()
        defer { gateway.stop() }
        let user = "bob-\(UUID().uuidString.prefix(8))"
        let (first, firstLog) = try await livePhone(gateway, user: user)
        let kept = try await gateway.publish(user: user, appNotificationId: "kept", title: "one")
        let deleted = try await gateway.publish(user: user, appNotificationId: "deleted", title: "two")
        try await firstLog.eventually("both arrived") { await first.notifications.count == 2 }
        await first.stop()
        let cursor = await first.cursor
        let epoch = await first.epoch

        // What happens while the app is not running.
        let added = try await gateway.publish(user: user, appNotificationId: "added", title: "three")
        try await gateway.delete(user: user, id: deleted)
        try await gateway.publish(user: user, appNotificationId: "kept", title: "one, edited")

        let second = try await client(gateway, user: user, device: "phone", file: "phone.db")
        // As its first token does, offline: the file is the user's, so its list shows.
        await second.adoptScope(of: try await gateway.token(user: user))
        let resumedCursor = await second.cursor
        let resumedEpoch = await second.epoch
        let resumedIds = Set(await second.notifications.map(\.id))
        XCTAssertEqual(resumedCursor, cursor)
        XCTAssertEqual(resumedEpoch, epoch)
        XCTAssertEqual(resumedIds, [kept, deleted])

        let log = EventLog()
        try await log.startLive(second, as: "phone")
        try await assertLocalEqualsServer(second, gateway, user: user)

        // Exactly what it missed, in feed order, and no reset.
        var feed: [String] = []
        for event in await log.events(of: "phone") {
            switch event {
            case .upserted(let n): feed.append("upsert \(n.id) v\(n.version)")
            case .removed(let id, let reason): feed.append("remove \(id) \(reason)")
            case .reset: feed.append("reset")
            default: break
            }
        }
        XCTAssertEqual(feed, ["upsert \(added) v1", "remove \(deleted) deleted", "upsert \(kept) v2"])
        await second.stop()
    }

    func testMalformedAndUnknownFramesAreReportedAndSkipped() async throws {
        let options = HeraldClient.Options(url: "http://127.0.0.1:9", deviceId: "phone",
                                           stateFile: directory.appendingPathComponent("state.db").path)
        let client = try HeraldClient(options: options, token: { "unused" })
        var events = client.events.makeAsyncIterator()
        // As a first token does, without a gateway: the state file's owner is known.
        await client.adoptScope(of: "unused")
        // The stream's opening (the connection, the empty set, its count), in whichever order the two met.
        for _ in 0..<3 { _ = await events.next() }

        await client.receive(#"{"type":"reset","notifications":[\#(Self.notification("n_1"))],"cursor":5,"epoch":"e1","final":true}"#)
        guard case .reset(let list)? = await events.next() else { return XCTFail("no reset event") }
        XCTAssertEqual(list.map(\.id), ["n_1"])

        let bad = [
            "not json",
            "[1, 2]",
            #"{"no":"type"}"#,
            #"{"type":"changes","changes":[{"seq":6,"op":"upsert"}],"cursor":6}"#,
            #"{"type":"change","change":{"seq":"6","op":"delete","id":"n_1","appNotificationId":"a","reason":"deleted"}}"#,
            #"{"type":"reset","notifications":[],"cursor":"x","epoch":"e2","final":true}"#,
            #"{"type":"welcome","cursor":7}"#,
        ]
        for text in bad {
            await client.receive(text)
            guard case .problem(.badFrame)? = await events.next() else { return XCTFail("\(text) was not reported") }
        }
        await client.receive(#"{"type":"somethingNew","x":1}"#)
        let unknown = await events.next()
        XCTAssertEqual(unknown, .problem(.unknownFrame(type: "somethingNew")))
        let cursor = await client.cursor
        let ids = await client.notifications.map(\.id)
        XCTAssertEqual(cursor, 5)
        XCTAssertEqual(ids, ["n_1"])

        // Still applying what is good; a repeated seq is applied once.
        let delete = #"{"type":"change","change":{"seq":6,"op":"delete","id":"n_1","appNotificationId":"a","reason":"expired"}}"#
        await client.receive(delete)
        let removed = await events.next()
        XCTAssertEqual(removed, .removed(id: "n_1", reason: .expired))
        await client.receive(#"{"type":"change","change":{"seq":6,"op":"upsert","notification":\#(Self.notification("n_1"))}}"#)
        await client.receive(#"{"type":"counts","unread":0}"#)
        let next = await events.next()
        XCTAssertEqual(next, .unread(0), "the duplicate seq 6 was applied")
        let after = await client.notifications
        let afterCursor = await client.cursor
        XCTAssertEqual(after, [])
        XCTAssertEqual(afterCursor, 6)
    }

    func testTheClientReconnectsByItselfWhenTheGatewayRestarts() async throws {
        let store = "sqlite:" + directory.appendingPathComponent("herald.db").path
        var gateway = try GatewayProcess(store: store)
        defer { gateway.stop() }
        let user = "carol-\(UUID().uuidString.prefix(8))"
        let (phone, log) = try await livePhone(gateway, user: user)
        let before = try await gateway.publish(user: user, appNotificationId: "before", title: "one")
        try await log.eventually("the first arrived") { await phone.notification(id: before) != nil }

        gateway.stop()
        try await log.eventually("offline with a retry planned") {
            if case .offline(let retry) = await phone.connection { return retry != nil }
            return false
        }
        gateway = try GatewayProcess(store: store, port: gateway.port)
        let after = try await gateway.publish(user: user, appNotificationId: "after", title: "two")
        try await log.eventually("back, with what was published meanwhile") {
            let (live, n) = (await phone.isLive, await phone.notification(id: after))
            return live && n != nil
        }
        try await assertLocalEqualsServer(phone, gateway, user: user)
        let resets = await log.events(of: "phone").filter { if case .reset = $0 { return true }; return false }
        XCTAssertEqual(resets.count, 1, "only the first connection's reset: the reconnect resumed")
        let polled = await log.events(of: "phone").contains(.connection(.live(transport: "poll")))
        XCTAssertFalse(polled, "a gateway that was down is no refused upgrade: no long-poll fallback")
        await phone.stop()
    }

    func testARefusedTokenIsReplacedThroughTheProvider() async throws {
        let gateway = try GatewayProcess()
        defer { gateway.stop() }
        let user = "dave-\(UUID().uuidString.prefix(8))"
        let good = try await gateway.token(user: user)
        let calls = Mutex(0)
        let phone = try await client(gateway, user: user, device: "phone", file: "phone.db", token: {
            // The first token is refused (close 4001); the client must ask again.
            calls.withLock { $0 += 1; return $0 } == 1 ? "not.a.token" : good
        })
        let log = EventLog()
        try await log.startLive(phone, as: "phone")
        XCTAssertEqual(calls.withLock { $0 }, 2)
        await phone.stop()
    }

    /// Starts a client over wss:// and answers the reason of its first failed
    /// connection, or nil once it is live.
    private func firstFailure(_ gateway: GatewayProcess, caFile: String?, device: String) async throws -> String? {
        let token = try GatewayProcess.mintToken(user: "erin")
        let options = HeraldClient.Options(url: gateway.baseURL, deviceId: device,
                                           stateFile: directory.appendingPathComponent("\(device).db").path)
        let client = try HeraldClient(options: options, transport: LWSTransport(caFile: caFile), token: { token })
        let log = EventLog()
        await log.watch(client, as: device)
        await client.start()
        @Sendable func failure() async -> String? {
            for case .problem(.connectionLost(_, let reason)) in await log.events(of: device) { return reason }
            return nil
        }
        try await log.eventually("live or refused") {
            let (failed, live) = (await failure(), await client.isLive)
            return failed != nil || live
        }
        await client.stop()
        return await failure()
    }

    func testWSSVerifiesTheGatewayCertificateAndName() async throws {
        let good = try certificate("gateway", altName: "IP:127.0.0.1")
        let gateway = try GatewayProcess(arguments: ["--tls-cert", good.cert, "--tls-key", good.key])
        defer { gateway.stop() }
        XCTAssert(gateway.baseURL.hasPrefix("https://"))
        let trusted = try await firstFailure(gateway, caFile: good.cert, device: "trusting")
        XCTAssertNil(trusted, "a certificate from the given CA file was refused")
        // The self-signed certificate is not in the system's trust store.
        let untrusted = try await firstFailure(gateway, caFile: nil, device: "system")
        XCTAssertEqual(untrusted, "the gateway's certificate was refused: self-signed certificate")

        let misnamed = try certificate("elsewhere", altName: "DNS:elsewhere.example")
        let other = try GatewayProcess(arguments: ["--tls-cert", misnamed.cert, "--tls-key", misnamed.key])
        defer { other.stop() }
        let wrongName = try await firstFailure(other, caFile: misnamed.cert, device: "named")
        XCTAssertEqual(wrongName, "the gateway's certificate was refused: IP address mismatch")
    }

    func testBackoffDoublesWithJitterUpToItsCap() {
        var backoff = HeraldClient.Backoff()
        backoff.initial = .milliseconds(100)
        backoff.cap = .seconds(1)
        for attempt in 0..<12 {
            let ceiling = min(.seconds(1), .milliseconds(100) * (1 << attempt))
            let delay = backoff.delay(attempt: attempt)
            XCTAssert(delay >= ceiling / 2 && delay <= ceiling, "attempt \(attempt): \(delay)")
        }
    }

    private static func notification(_ id: String) -> String {
        #"{"id":"\#(id)","appNotificationId":"a","userId":"u","payload":{"title":"t"},"priority":"normal","# +
        #""groupName":null,"displayTimeToLive":null,"targetPlatforms":null,"targetTags":null,"# +
        #""createdAt":"2026-11-22T10:00:00.000Z","updatedAt":"2026-11-22T10:00:00.000Z","# +
        #""expiresAt":"2026-12-22T10:00:00.000Z","readState":"unread","userActionState":"noInteraction","version":1}"#
    }
}

/// Preferences (SPEC section 12): saved on one device, held by every one.
final class ClientPreferencesTests: ClientTestCase {
    func testASaveOnOneDeviceReachesTheOthersStateEventsAndModel() async throws {
        let gateway = try GatewayProcess()
        defer { gateway.stop() }
        let user = "noa-\(UUID().uuidString.prefix(8))"
        let (phone, laptop, log) = try await livePhoneAndLaptop(gateway, user: user)
        let model = await MainActor.run { HeraldModel(client: laptop) }
        try await log.eventually("both hold the unsaved ones from their reset") {
            let (p, l) = (await phone.preferences, await laptop.preferences)
            return p == .unsaved && l == .unsaved
        }

        let saved = try await phone.savePreferences(groups: ["ads": Channels(inbox: false)], ifVersion: 0)
        XCTAssertEqual(saved.version, 1)
        XCTAssertFalse(saved.allows(.inbox, group: "ads"))
        // The log hears of events after the client's state has moved: wait for the event.
        try await log.eventually("an event tells the laptop of the save") {
            await log.events(of: "laptop").contains(.preferences(saved))
        }
        let held = await laptop.preferences
        XCTAssertEqual(held, saved, "the laptop holds the save")
        try await model.until("the model shows it") { model.preferences == saved }
        let fetched = try await laptop.fetchPreferences()
        XCTAssertEqual(fetched, saved)

        do {
            try await laptop.savePreferences(groups: [:], ifVersion: 0)
            XCTFail("a stale ifVersion was accepted")
        } catch {
            guard case .server(let code, _) = error else { return XCTFail("unexpected \(error)") }
            XCTAssertEqual(code, "precondition_failed")
        }
        let after = try await phone.fetchPreferences()
        XCTAssertEqual(after, saved, "nothing saved")
        await phone.stop()
        await laptop.stop()

        // The state file keeps them: a resume (no reset) shows them at once.
        let again = try await client(gateway, user: user, device: "laptop", file: "laptop.db")
        try await log.startLive(again, as: "again")
        let resumed = await again.preferences
        XCTAssertEqual(resumed, saved)
        let resumedEvents = await log.events(of: "again")
        XCTAssertFalse(resumedEvents.contains { if case .reset = $0 { true } else { false } }, "resumed, not reset")
        await again.stop()
    }
}

/// HeraldModel: the client's state on the main actor, for SwiftUI.
final class HeraldModelTests: ClientTestCase {
    func testTheModelMirrorsTheClientAndTellsItsObservers() async throws {
        let gateway = try GatewayProcess()
        defer { gateway.stop() }
        let user = "mia-\(UUID().uuidString.prefix(8))"
        let early = try await gateway.publish(user: user, appNotificationId: "early", title: "before the model")
        let phone = try await client(gateway, user: user, device: "phone", file: "phone.db")
        let log = EventLog()
        try await log.startLive(phone, as: "phone")
        // Made after start: its stream opens with the state as it is.
        let model = await MainActor.run { HeraldModel(client: phone) }
        var ids = [early]
        for i in 0..<3 { ids.append(try await gateway.publish(user: user, appNotificationId: "n\(i)", title: "\(i)")) }
        try await model.until("it has all four, newest first") { [ids] in
            model.notifications.map(\.id) == ids.reversed() && model.unread == 4
        }

        let changed = Mutex(false)
        await MainActor.run {
            withObservationTracking { _ = model.notifications } onChange: { changed.withLock { $0 = true } }
        }
        try await phone.dismiss(ids[1])
        try await model.until("the dismiss reached it") { [ids] in
            model.notifications.first { $0.id == ids[1] }?.userActionState == .dismissed && model.unread == 3
        }
        XCTAssertTrue(changed.withLock { $0 }, "observers were not told")
        let (mirrored, connection) = await MainActor.run { (model.notifications, model.connection) }
        let local = await phone.notifications
        XCTAssertEqual(mirrored, local)
        XCTAssertEqual(connection, .live(transport: "websocket"))
        await MainActor.run { model.stop() }
        await phone.stop()
    }
}

extension HeraldModel {
    /// Returns once `condition` holds, checked again at each change the
    /// model's observers are told of; fails at `timeout`.
    func until(_ what: String, timeout: Duration = .seconds(15), _ condition: @MainActor () -> Bool) async throws {
        let deadline = ContinuousClock.now + timeout
        while !condition() {
            guard ContinuousClock.now < deadline else { throw GatewayFailure("timed out waiting until \(what)") }
            await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
                let waiting = Mutex<CheckedContinuation<Void, Never>?>(c)
                let wake: @Sendable () -> Void = { waiting.withLock { w in w?.resume(); w = nil } }
                withObservationTracking { _ = condition() } onChange: { wake() }
                Task { try? await Task.sleep(until: deadline); wake() }
            }
        }
    }
}
