import Foundation
@testable import HeraldClient
import XCTest

/// The gateway's APNs stand-in (Tests/e2e/push_standins.py) as a process:
/// what the gateway's pushes look like when they reach a device.
final class APNsStandIn {
    let url: String
    let folder: URL
    private let process = Process()

    init(folder: URL) throws {
        self.folder = folder
        let script = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("e2e/push_standins.py")
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = ["python3", script.path, "apns", "--port", "0", "--state", folder.path]
        let out = Pipe()
        process.standardOutput = out
        process.standardError = FileHandle.nullDevice
        try process.run()
        let line = GatewayProcess.firstLine(of: out)
        guard line.hasPrefix("listening on ") else { throw GatewayFailure("the APNs stand-in did not start: \(line)") }
        url = String(line.dropFirst("listening on ".count)).trimmingCharacters(in: .whitespacesAndNewlines)
    }

    deinit {
        process.terminate()
        process.waitUntilExit()
    }

    /// A config file for the client tests' app, pushing through this stand-in.
    func gatewayConfig(in directory: URL) throws -> String {
        let info = try JSONSerialization.jsonObject(with: Data(contentsOf: folder.appendingPathComponent("standin.json"))) as! [String: Any]
        let apns: [String: Any] = ["teamId": info["teamId"]!, "keyId": info["keyId"]!, "keyFile": info["keyFile"]!,
                                   "topic": info["topic"]!, "endpoint": url, "developmentEndpoint": url, "caFile": info["caFile"]!]
        let app: [String: Any] = ["id": GatewayProcess.app, "serverKey": GatewayProcess.serverKey,
                                  "tokenSecret": GatewayProcess.tokenSecret,
                                  "push": ["alert": ["title": "/title", "body": "/title"], "apns": apns]]
        let path = directory.appendingPathComponent("herald.json").path
        try JSONSerialization.data(withJSONObject: ["apps": [app]]).write(to: URL(fileURLWithPath: path))
        return path
    }

    /// The `userInfo` of each push received so far, in order: the JSON body
    /// APNs hands the app.
    func received() -> [[AnyHashable: Any]] {
        guard let text = try? String(contentsOf: folder.appendingPathComponent("received.jsonl"), encoding: .utf8) else { return [] }
        return text.split(separator: "\n").compactMap { line in
            (try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])?["payload"] as? [String: Any]
        }
    }

    /// Waits (bounded) until `count` pushes were received; answers them all.
    func waitFor(_ count: Int, timeout: Duration = .seconds(15)) async throws -> [[AnyHashable: Any]] {
        let deadline = ContinuousClock.now + timeout
        while true {
            let got = received()
            if got.count >= count { return got }
            guard ContinuousClock.now < deadline else { throw GatewayFailure("the stand-in received \(got.count) of \(count) pushes") }
            try await Task.sleep(for: .milliseconds(20))
        }
    }
}

/// HeraldClient on a device that is not connected: its handle registered,
/// the gateway's pushes (as APNs hands them to the app) fed to `handlePush`.
final class ClientPushTests: ClientTestCase {
    static let apnsToken = Data((0..<32).map { UInt8($0) })

    func testAPushBringsASleepingDeviceUpToDateAndADismissElsewhereClearsItsTray() async throws {
        let standIn = try APNsStandIn(folder: directory.appendingPathComponent("apns"))
        let gateway = try GatewayProcess(config: try standIn.gatewayConfig(in: directory))
        defer { gateway.stop() }
        let user = "pia-\(UUID().uuidString.prefix(8))"
        let phone = try await client(gateway, user: user, device: "phone", platform: .ios, file: "phone.db")
        try await phone.registerPush(.apns(token: Self.apnsToken, environment: .development))
        let laptop = try await client(gateway, user: user, device: "laptop", file: "laptop.db")
        let log = EventLog()
        try await log.startLive(laptop, as: "laptop")

        // A publish: the sleeping phone gets an alert, which it syncs from.
        let id = try await gateway.publish(user: user, appNotificationId: "task-1", title: "Review the draft")
        let alert = try await standIn.waitFor(1)[0]
        XCTAssertEqual((alert["aps"] as? [String: Any])?["alert"] as? [String: String], ["title": "Review the draft", "body": "Review the draft"])
        let push = try XCTUnwrap(ReceivedPush(userInfo: alert), "Herald's push was not recognised")
        XCTAssertEqual(push.notificationId, id)
        XCTAssertEqual(push.op, "upsert")
        let first = try await phone.handlePush(push)
        // Its first sync: a reset (no cursor yet) with the notification.
        XCTAssertEqual(first.changes.flatMap { e -> [String] in
            switch e {
            case .upserted(let n): [n.id]
            case .reset(let list): list.map(\.id)
            default: []
            }
        }, [id])
        XCTAssertEqual(first.trayRemovals, [])
        var server = try await gateway.notifications(user: user)
        var local = await snapshots(phone)
        XCTAssertEqual(local, server)

        // Dismissed on the laptop: the tap that follows takes it out of the phone's tray.
        try await laptop.dismiss(id)
        let tap = try await standIn.waitFor(2)[1]
        XCTAssertEqual((tap["aps"] as? [String: Any])?["content-available"] as? Int, 1)
        let second = try await phone.handlePush(try XCTUnwrap(ReceivedPush(userInfo: tap)))
        XCTAssertEqual(second.trayRemovals, [id])
        server = try await gateway.notifications(user: user)
        local = await snapshots(phone)
        XCTAssertEqual(local, server)

        // The first push again (late, or repeated): nothing to do, nothing asked.
        gateway.stop()
        let again = try await phone.handlePush(push)
        XCTAssertEqual(again.changes, [])
        XCTAssertEqual(again.trayRemovals, [])
        await laptop.stop()
    }

    func testAHandleIsRegisteredOnceAndRemovedOnRequest() async throws {
        let standIn = try APNsStandIn(folder: directory.appendingPathComponent("apns"))
        let config = try standIn.gatewayConfig(in: directory)
        let gateway = try GatewayProcess(config: config)
        let user = "quinn-\(UUID().uuidString.prefix(8))"
        let phone = try await client(gateway, user: user, device: "phone", platform: .ios, file: "phone.db")
        try await phone.registerPush(.apns(token: Self.apnsToken, environment: .production))
        let registered = try await gateway.devices(user: user)
        XCTAssertEqual(registered["phone"]?["push"] as? [String: String], ["service": "apns"])

        // Each launch hands the same token over: with the gateway away, a request would fail.
        gateway.stop()
        let token = try GatewayProcess.mintToken(user: user)
        let relaunched = try HeraldClient(options: .init(url: gateway.baseURL, deviceId: "phone", platform: .ios,
                                                         stateFile: directory.appendingPathComponent("phone.db").path),
                                          token: { token })
        try await relaunched.registerPush(.apns(token: Self.apnsToken, environment: .production))

        let back = try GatewayProcess(port: gateway.port, config: config)
        defer { back.stop() }
        // The memory store forgot the registration; a new handle is sent.
        do {
            try await relaunched.registerPush(.fcm(token: "fcm-token"))
            XCTFail("a handle for a service the app has not configured was accepted")
        } catch {
            guard case .server("bad_request", _) = error else { return XCTFail("unexpected \(error)") }
        }
        try await relaunched.registerPush(.apns(token: Data(repeating: 7, count: 32), environment: .production))
        var listed = try await back.devices(user: user)
        XCTAssertEqual(listed["phone"]?["push"] as? [String: String], ["service": "apns"])
        try await relaunched.removePush()
        listed = try await back.devices(user: user)
        XCTAssert(listed["phone"]?["push"] is NSNull, "the handle is gone: \(String(describing: listed["phone"]))")
    }

    func testAGatewayThatLostItsHistoryIsGivenTheHandleAgain() async throws {
        let standIn = try APNsStandIn(folder: directory.appendingPathComponent("apns"))
        let config = try standIn.gatewayConfig(in: directory)
        let gateway = try GatewayProcess(config: config)
        let user = "sasha-\(UUID().uuidString.prefix(8))"
        let (phone, log) = try await livePhone(gateway, user: user)
        try await phone.registerPush(.apns(token: Self.apnsToken, environment: .production))
        let oldEpoch = await phone.epoch
        gateway.stop()

        // A memory store restarted: no history, no registrations. The client
        // reconnects, is reset into the new epoch, and sends its handle unasked.
        let back = try GatewayProcess(port: gateway.port, config: config)
        defer { back.stop() }
        let deadline = ContinuousClock.now + .seconds(15)
        var listed: [String: [String: Any]] = [:]
        while ContinuousClock.now < deadline {
            listed = try await back.devices(user: user)
            // Listed, and remembered once the gateway's answer came back.
            if listed["phone"]?["push"] is [String: String], await phone.registeredPush != nil { break }
            try await Task.sleep(for: .milliseconds(50))
        }
        let events = await log.events(of: "phone")
        XCTAssertEqual(listed["phone"]?["push"] as? [String: String], ["service": "apns"], "\(events)")
        let epoch = await phone.epoch
        XCTAssertNotEqual(epoch, oldEpoch)
        // Registered again, and remembered: the app's next launch sends nothing.
        back.stop()
        try await phone.registerPush(.apns(token: Self.apnsToken, environment: .production))
        await phone.stop()
    }

    func testOtherPushesAreNotHerald() {
        XCTAssertNil(ReceivedPush(userInfo: ["aps": ["alert": "From another SDK"]]))
        XCTAssertNil(ReceivedPush(userInfo: ["herald": ["cursor": 3, "epoch": "e", "op": "bogus"]]))
        // FCM's data: the same fields, flat, as strings.
        let fcm = ReceivedPush(userInfo: ["kind": "tap", "cursor": "42", "epoch": "e1", "op": "state", "id": "n_1"])
        XCTAssertEqual(fcm?.cursor, 42)
        XCTAssertEqual(fcm?.notificationId, "n_1")
    }

    func testSyncOnceAfterTheGatewayLostItsHistoryPagesAReset() async throws {
        let gateway = try GatewayProcess()
        let user = "rafa-\(UUID().uuidString.prefix(8))"
        let phone = try await client(gateway, user: user, device: "phone", file: "phone.db")
        let old = try await gateway.publish(user: user, appNotificationId: "old", title: "before the restart")
        let synced = try await phone.syncOnce()
        XCTAssertEqual(synced.changes.count, 1)
        let oldEpoch = await phone.epoch
        gateway.stop()

        // A memory store restarted: another epoch, and more than one page (500) of notifications.
        let fresh = try GatewayProcess(port: gateway.port)
        defer { fresh.stop() }
        for i in 0..<520 { try await fresh.publish(user: user, appNotificationId: "n\(i)", title: "\(i)") }
        let reset = try await phone.syncOnce()
        XCTAssertEqual(reset.changes.filter { if case .reset = $0 { return true }; return false }.count, 1)
        XCTAssertEqual(reset.trayRemovals, [old], "what the lost history held is out of the tray")
        let epoch = await phone.epoch
        XCTAssertNotEqual(epoch, oldEpoch)
        let server = try await fresh.notifications(user: user)
        XCTAssertEqual(server.count, 520)
        let local = await snapshots(phone)
        XCTAssertEqual(local, server)
    }
}
