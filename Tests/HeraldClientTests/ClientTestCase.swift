import Foundation
import HeraldClient
import XCTest

/// What the client test files share: a scratch directory per test for state
/// files, clients with quick reconnects, and the local set in the form the
/// server's listing is compared in.
class ClientTestCase: XCTestCase {
    var directory: URL!

    override func setUpWithError() throws {
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("herald-client-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
    }

    override func tearDownWithError() throws {
        try? FileManager.default.removeItem(at: directory)
    }

    /// A client of `user` on `gateway` (or on `url`, a front of it) with its
    /// state in `file` (in the test's directory); `token` defaults to one
    /// hour-long token for the user.
    func client(_ gateway: GatewayProcess, url: String? = nil, user: String, device: String,
                platform: Platform = .other, file: String, token: HeraldClient.TokenProvider? = nil,
                transport: (any HeraldTransport)? = nil,
                configure: (inout HeraldClient.Options) -> Void = { _ in }) async throws -> HeraldClient {
        let fixed = try await gateway.token(user: user)
        var options = HeraldClient.Options(url: url ?? gateway.baseURL, deviceId: device, platform: platform,
                                           stateFile: directory.appendingPathComponent(file).path)
        // Quick retries keep the reconnect tests short; they wait for events, not for time.
        options.reconnect.initial = .milliseconds(50)
        options.reconnect.cap = .milliseconds(500)
        configure(&options)
        return try HeraldClient(options: options, transport: transport ?? HeraldClient.platformTransport, token: token ?? { fixed })
    }

    /// A client named "phone" (state in phone.db), watched by a new log and live.
    func livePhone(_ gateway: GatewayProcess, user: String,
                   token: HeraldClient.TokenProvider? = nil) async throws -> (HeraldClient, EventLog) {
        let phone = try await client(gateway, user: user, device: "phone", file: "phone.db", token: token)
        let log = EventLog()
        try await log.startLive(phone, as: "phone")
        return (phone, log)
    }

    /// Clients "phone" and "laptop" of `user` (state in phone.db and
    /// laptop.db), both watched by one new log and live.
    func livePhoneAndLaptop(_ gateway: GatewayProcess, user: String) async throws -> (HeraldClient, HeraldClient, EventLog) {
        let (phone, log) = try await livePhone(gateway, user: user)
        let laptop = try await client(gateway, user: user, device: "laptop", file: "laptop.db")
        try await log.startLive(laptop, as: "laptop")
        return (phone, laptop, log)
    }

    /// The client's local set in the form the server listing is compared in.
    func snapshots(_ client: HeraldClient) async -> [String: Snapshot] {
        Dictionary(uniqueKeysWithValues: await client.notifications.map { ($0.id, Snapshot($0)) })
    }

    /// Asserts that the client's local set equals the gateway's listing of `user`.
    func assertLocalEqualsServer(_ client: HeraldClient, _ gateway: GatewayProcess, user: String,
                                 file: StaticString = #filePath, line: UInt = #line) async throws {
        let server = try await gateway.notifications(user: user)
        let local = await snapshots(client)
        XCTAssertEqual(local, server, file: file, line: line)
    }

    /// A self-signed certificate for `subjectAltName` (and its key), in the test's directory.
    func certificate(_ name: String, altName: String) throws -> (cert: String, key: String) {
        let cert = directory.appendingPathComponent("\(name).crt").path
        let key = directory.appendingPathComponent("\(name).key").path
        let openssl = Process()
        openssl.executableURL = URL(fileURLWithPath: "/usr/bin/openssl")
        openssl.arguments = ["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                             "-days", "2", "-subj", "/CN=\(name)", "-addext", "subjectAltName=\(altName)",
                             "-keyout", key, "-out", cert]
        openssl.standardError = FileHandle.nullDevice
        try openssl.run()
        openssl.waitUntilExit()
        XCTAssertEqual(openssl.terminationStatus, 0)
        return (cert, key)
    }
}
