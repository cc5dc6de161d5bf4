// The code of docs/CLIENT-SWIFT.md, built by `swift build` so the walk-through
// cannot drift from the library. Try it against a demo gateway:
//
//   herald serve --demo --port 8080 &
//   herald-client-example http://127.0.0.1:8080 alice phone-1
//
// then type `dismiss <id>`, `read <id>`, `history`, `unread`, `readall`,
// `delete <id>`, `signout` or `quit`.
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import HeraldClient

// MARK: 1. A token from your server

/// Asks the app's own server for a device token. Here: the demo gateway's
/// `POST /v1/demo/token`; a real app calls its backend, which calls
/// `POST /v1/apps/{app}/tokens` with the server key.
func fetchToken(gateway: String, user: String, device: String) async throws -> String {
    var request = URLRequest(url: URL(string: gateway + "/v1/demo/token")!)
    request.httpMethod = "POST"
    request.setValue("application/json", forHTTPHeaderField: "Content-Type")
    request.httpBody = try JSONSerialization.data(withJSONObject: ["userId": user, "deviceId": device])
    let (data, _) = try await URLSession.shared.data(for: request)
    guard let answer = try JSONSerialization.jsonObject(with: data) as? [String: Any],
          let token = answer["token"] as? String else { throw URLError(.badServerResponse) }
    return token
}

// MARK: 2. Connect

let arguments = CommandLine.arguments
guard arguments.count == 4 else {
    print("usage: herald-client-example GATEWAY-URL USER DEVICE")
    exit(2)
}
let (gateway, user, device) = (arguments[1], arguments[2], arguments[3])

let client = try HeraldClient(
    options: .init(url: gateway, deviceId: device, platform: .other,
                   stateFile: "\(device).herald.sqlite"),
    token: { try await fetchToken(gateway: gateway, user: user, device: device) })
await client.start()

// MARK: 3. Show the list and the badge

func render(_ list: [HeraldNotification], unread: Int) {
    print("— \(list.count) notifications, \(unread) unread")
    for n in list {
        let title = n.payload["title"]?.stringValue ?? "(no title)"
        print("  \(n.id)  \(n.readState == .unread ? "●" : " ") \(title)  [\(n.userActionState.rawValue)]")
    }
}

// What was stored shows at once; the connection brings it up to date.
render(await client.notifications, unread: await client.unread)

// Detached: this program's main actor blocks in readLine() below.
let watcher = Task.detached {
    for await event in client.events {
        switch event {
        case .upserted, .removed, .reset:
            render(await client.notifications, unread: await client.unread)
        case .unread(let count):
            print("badge: \(count)")
        case .preferences(let p):
            print("preferences v\(p.version): muted \(p.groups.filter { $0.value.inbox == false }.keys.sorted())")
        case .connection(let state):
            print("connection: \(state)")
        case .problem(let problem):
            print("problem: \(problem)")
        }
    }
}

// MARK: 5. Page history

/// Every notification the gateway keeps for this device (or only the unread
/// ones), a page of 100 at a time.
func printHistory(unreadOnly: Bool) async throws(HeraldClientError) {
    var next: String?
    repeat {
        let page = try await client.history(limit: 100, before: next, readState: unreadOnly ? .unread : nil)
        for n in page.notifications { print("  \(n.id)  \(n.payload["title"]?.stringValue ?? "")") }
        next = page.next
    } while next != nil
    let counts = try await client.counts()
    print("— \(counts.total) in all, \(counts.unread) unread")
}

// MARK: 4. Handle a dismiss (and the other actions)

while let line = readLine() {
    let words = line.split(separator: " ").map(String.init)
    do {
        switch (words.first, words.count) {
        case ("dismiss", 2): try await client.dismiss(words[1])
        case ("read", 2): try await client.markRead(words[1])
        case ("history", 1): try await printHistory(unreadOnly: false)
        case ("unread", 1): try await printHistory(unreadOnly: true)
        case ("readall", 1): print("marked \(try await client.readAll()) read")
        // MARK: 6. Delete
        case ("delete", 2): try await client.delete(words[1])
        // MARK: 7. Sign out: forget this device's state
        case ("signout", 1):
            await client.signOut()
            exit(0)
        case ("quit", 1):
            await client.stop()
            exit(0)
        default: print("commands: dismiss ID, read ID, history, unread, readall, delete ID, signout, quit")
        }
    } catch .server(let code, let message) {
        print("refused: \(code) (\(message))")
    } catch {
        print("failed: \(error)")
    }
}
await client.stop()
watcher.cancel()
