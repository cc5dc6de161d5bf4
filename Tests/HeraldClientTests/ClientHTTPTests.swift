import Foundation
@testable import HeraldClient
import HeraldClientLWS
import XCTest

/// HeraldClient over HTTP: history, counts and actions on demand, and the
/// long-poll fallback behind a front that refuses WebSocket upgrades.
final class ClientHTTPTests: ClientTestCase {
    func testHistoryCountsAndActionsOverHTTPWithoutAConnection() async throws {
        let gateway = try GatewayProcess()
        defer { gateway.stop() }
        let user = "frank-\(UUID().uuidString.prefix(8))"
        var published: [String] = []
        for i in 0..<120 { published.append(try await gateway.publish(user: user, appNotificationId: "n\(i)", title: "#\(i)")) }
        // Never started: everything below goes over HTTP.
        let tablet = try await client(gateway, user: user, device: "tablet", file: "tablet.db")

        var paged: [String] = []
        var next: String?
        repeat {
            let page = try await tablet.history(limit: 50, before: next)
            XCTAssertLessThanOrEqual(page.notifications.count, 50)
            paged += page.notifications.map(\.id)
            next = page.next
        } while next != nil
        XCTAssertEqual(paged, published.reversed(), "newest first, every one once")

        let dismissed = try await tablet.dismiss(published[7], ifVersion: 1)
        XCTAssertEqual(dismissed?.userActionState, .dismissed)
        XCTAssertEqual(dismissed?.readState, .read)
        XCTAssertEqual(dismissed?.seenState, .seen, "read makes it seen")
        XCTAssertEqual(dismissed?.version, 2)
        try await tablet.markRead(published[8])
        try await tablet.delete(published[9])
        do {
            try await tablet.markRead(published[7], ifVersion: 1)
            XCTFail("a stale If-Match was accepted")
        } catch {
            XCTAssertEqual(error, .server(code: "precondition_failed", message: "version is 2, not 1"))
        }
        do {
            try await tablet.delete(published[9])
            XCTFail("a deleted notification was deleted again")
        } catch {
            guard case .server("not_found", _) = error else { return XCTFail("unexpected \(error)") }
        }

        let unread = try await tablet.history(limit: 500, readState: .unread)
        XCTAssertEqual(unread.notifications.count, 117)
        let counts = try await tablet.counts()
        XCTAssertEqual(counts, Counts(unread: 117, noInteraction: 118, total: 119, unseen: 117))
        // Snoozed until an hour from now, then the time moved: over HTTP as over WebSocket.
        let hour = Int64(Date().timeIntervalSince1970 * 1000) + 3_600_000
        let snoozed = try await tablet.snooze(published[11], until: hour)
        XCTAssertEqual(snoozed?.userActionState, .snoozed)
        XCTAssertEqual(snoozed?.snoozedUntil, hour)
        let moved = try await tablet.update(published[11], snoozedUntil: hour + 60_000)
        XCTAssertEqual(moved?.snoozedUntil, hour + 60_000)
        do {
            try await tablet.snooze(published[12], until: Int64(Date().timeIntervalSince1970 * 1000) - 1_000)
            XCTFail("a snooze into the past was accepted")
        } catch {
            XCTAssertEqual(error, .server(code: "bad_request", message: "snoozedUntil must be in the future"))
        }
        let one = try await tablet.markSeen(published[10])
        XCTAssertEqual(one?.seenState, .seen)
        XCTAssertEqual(one?.readState, .unread)
        let seen = try await tablet.seenAll()
        XCTAssertEqual(seen, 116)
        let afterSeen = try await tablet.counts()
        XCTAssertEqual(afterSeen, Counts(unread: 117, noInteraction: 117, total: 119, unseen: 0), "seen is not read; one snoozed")
        let marked = try await tablet.readAll()
        XCTAssertEqual(marked, 117)
        let after = try await tablet.counts()
        XCTAssertEqual(after.unread, 0)

        // The server's view agrees, and the local set was left alone: it
        // changes only from the feed.
        let server = try await gateway.notifications(user: user)
        XCTAssertEqual(server.count, 119)
        XCTAssert(server.values.allSatisfy { $0.readState == "read" })
        let local = await tablet.notifications
        XCTAssertEqual(local, [])
    }

    func testHTTPVerifiesTheGatewayCertificate() async throws {
        let good = try certificate("gateway", altName: "IP:127.0.0.1")
        let gateway = try GatewayProcess(arguments: ["--tls-cert", good.cert, "--tls-key", good.key])
        defer { gateway.stop() }
        let token = try GatewayProcess.mintToken(user: "gina")
        func counts(caFile: String?) async throws(HeraldClientError) -> Counts {
            let options = HeraldClient.Options(url: gateway.baseURL, deviceId: "phone",
                                               stateFile: directory.appendingPathComponent("\(UUID()).db").path)
            let client = try HeraldClient(options: options, transport: LWSTransport(caFile: caFile), token: { token })
            return try await client.counts()
        }
        let trusted = try await counts(caFile: good.cert)
        XCTAssertEqual(trusted, Counts(unread: 0, noInteraction: 0, total: 0, unseen: 0))
        do {
            _ = try await counts(caFile: nil)
            XCTFail("a self-signed certificate was accepted over https")
        } catch {
            XCTAssertEqual(error, .unreachable("the gateway's certificate was refused: self-signed certificate"))
        }
    }

    func testAFrontRefusingUpgradesIsSyncedByLongPollUntilWebSocketWorksAgain() async throws {
        let gateway = try GatewayProcess()
        defer { gateway.stop() }
        let front = try FrontProcess(upstreamPort: gateway.port)
        defer { front.stop() }
        let user = "hal-\(UUID().uuidString.prefix(8))"
        let early = try await gateway.publish(user: user, appNotificationId: "early", title: "before anyone looked")
        let phone = try await client(gateway, url: front.baseURL, user: user, device: "phone", file: "phone.db",
                                 configure: { $0.fallback.webSocketRetry = .seconds(2); $0.fallback.pollWait = .seconds(1) })
        let laptop = try await client(gateway, user: user, device: "laptop", file: "laptop.db")
        let log = EventLog()
        try await log.startLive(laptop, as: "laptop")
        await log.watch(phone, as: "phone")
        await phone.start()
        try await log.eventually("the phone polls, with what was there") {
            let (state, n) = (await phone.connection, await phone.notification(id: early))
            return state == .live(transport: "poll") && n != nil
        }

        let refusal = await log.events(of: "phone").contains {
            if case .problem(.connectionLost(1006, let reason)) = $0 { return reason.hasPrefix("the WebSocket upgrade was refused (HTTP 403)") }
            return false
        }
        XCTAssert(refusal, "the 403 was not reported")

        // Live changes both ways while polling.
        let live = try await gateway.publish(user: user, appNotificationId: "live", title: "while polling")
        try await log.eventually("a publish reaches the polling phone") { await phone.notification(id: live) != nil }
        try await phone.dismiss(live, ifVersion: 1)
        try await log.eventually("the laptop sees the phone's dismiss, and so does the phone") {
            let (l, p) = (await laptop.notification(id: live), await phone.notification(id: live))
            return l?.userActionState == .dismissed && p?.userActionState == .dismissed
        }
        let unread = await phone.unread
        XCTAssertEqual(unread, 1, "the dismiss marked it read")

        // The front lets upgrades through again: the phone goes back to its WebSocket.
        try front.allowUpgrades()
        try await log.eventually("the phone is on its WebSocket again", timeout: .seconds(30)) {
            await phone.connection == .live(transport: "websocket")
        }
        let later = try await gateway.publish(user: user, appNotificationId: "later", title: "over the WebSocket")
        try await log.eventually("it arrives") { await phone.notification(id: later) != nil }

        try await assertLocalEqualsServer(phone, gateway, user: user)
        // Every change applied once, across the hand-overs.
        var applied: [String] = []
        for case .upserted(let n) in await log.events(of: "phone") { applied.append("\(n.id) v\(n.version)") }
        XCTAssertEqual(applied, ["\(live) v1", "\(live) v2", "\(later) v1"])
        let resets = await log.events(of: "phone").filter { if case .reset = $0 { return true }; return false }
        XCTAssertEqual(resets.count, 1, "only the first sync was a reset")
        await phone.stop()
        await laptop.stop()
    }
}

/// `Tests/fronts/upgrade_refusing_front.py` in front of a gateway: refuses
/// WebSocket upgrades with 403 until told otherwise, passes the rest.
final class FrontProcess {
    let baseURL: String
    private let process = Process()
    private let control = Pipe()
    private let answers = Pipe()

    init(upstreamPort: Int) throws {
        let script = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("fronts/upgrade_refusing_front.py")
        process.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
        process.arguments = [script.path, String(upstreamPort)]
        process.standardInput = control
        process.standardOutput = answers
        try process.run()
        let line = GatewayProcess.firstLine(of: answers)
        guard line.hasPrefix("listening on ") else { throw GatewayFailure("the front did not start: \(line)") }
        baseURL = "http://127.0.0.1:" + line.dropFirst("listening on ".count)
    }

    /// Returns once the front has taken the order.
    func allowUpgrades() throws {
        control.fileHandleForWriting.write(Data("allow\n".utf8))
        let answer = GatewayProcess.firstLine(of: answers)
        guard answer == "ok" else { throw GatewayFailure("the front answered \(answer)") }
    }

    /// Closes its stdin, which ends it (a signal may be blocked in the
    /// signal mask it inherited from the test's thread).
    func stop() {
        guard process.isRunning else { return }
        try? control.fileHandleForWriting.close()
        process.waitUntilExit()
    }
}
