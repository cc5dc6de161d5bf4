import Foundation
@testable import HeraldClient
import XCTest

/// The URLSession transport against a real gateway. On Linux URLSession has
/// no WebSockets, so the upgrade is reported refused and the client syncs by
/// long-poll: HTTP (actions, history, counts, sync) carries everything.
final class URLSessionTransportTests: ClientTestCase {
    func testOnLinuxTheClientSyncsByLongPollAndActsOverHTTP() async throws {
        let gateway = try GatewayProcess()
        defer { gateway.stop() }
        let user = "uma-\(UUID().uuidString.prefix(8))"
        let early = try await gateway.publish(user: user, appNotificationId: "early", title: "before the client")
        let phone = try await client(gateway, user: user, device: "phone", file: "phone.db", transport: URLSessionTransport(),
                                     configure: { $0.fallback.pollWait = .seconds(1) })
        let log = EventLog()
        await log.watch(phone, as: "phone")
        await phone.start()
        try await log.eventually("polling, with what was there") {
            let (state, n) = (await phone.connection, await phone.notification(id: early))
            return state == .live(transport: "poll") && n != nil
        }
        let refusals = await log.events(of: "phone").filter {
            if case .problem(.connectionLost(1006, let reason)) = $0 { return reason.hasPrefix("the WebSocket upgrade was refused") }
            return false
        }
        XCTAssertGreaterThanOrEqual(refusals.count, 2, "the client polls after two refused upgrades")

        let live = try await gateway.publish(user: user, appNotificationId: "live", title: "while polling")
        try await log.eventually("a publish reaches it") { await phone.notification(id: live) != nil }
        try await phone.dismiss(live)
        try await log.eventually("its dismiss comes back through the feed") {
            await phone.notification(id: live)?.userActionState == .dismissed
        }
        let counts = try await phone.counts()
        XCTAssertEqual(counts, Counts(unread: 1, noInteraction: 1, total: 2, unseen: 1))
        let page = try await phone.history(limit: 1)
        XCTAssertEqual(page.notifications.map(\.id), [live])
        XCTAssertNotNil(page.next)
        do {
            try await phone.delete("n_missing")
            XCTFail("deleting nothing was accepted")
        } catch {
            guard case .server("not_found", _) = error else { return XCTFail("unexpected \(error)") }
        }
        try await assertLocalEqualsServer(phone, gateway, user: user)
        await phone.stop()
    }

    func testAGatewayThatIsNotThereIsUnreachable() async throws {
        let gone = try GatewayProcess()
        gone.stop()
        let token = try GatewayProcess.mintToken(user: "vic")
        let phone = try HeraldClient(options: .init(url: gone.baseURL, deviceId: "phone",
                                                    stateFile: directory.appendingPathComponent("phone.db").path),
                                     transport: URLSessionTransport(), token: { token })
        do {
            _ = try await phone.counts()
            XCTFail("a request to nothing succeeded")
        } catch {
            guard case .unreachable = error else { return XCTFail("unexpected \(error)") }
        }
    }
}
