import HeraldCore

/// One page of history (`HeraldClient.history`): newest first; pass `next`
/// as `before` for the following page, nil when this was the last.
public struct HistoryPage: Sendable, Equatable {
    public var notifications: [HeraldNotification]
    public var next: String?
}

/// Live notifications this device may see, counted by the gateway.
public struct Counts: Sendable, Equatable {
    public var unread: Int
    public var noInteraction: Int
    public var total: Int
    /// Notifications not yet seen (`seenState` `unseen`): what a badge counts.
    public var unseen: Int
}

/// What the polling route answers (PROTOCOL.md 4.6).
enum SyncAnswer {
    case changes([Change], cursor: Int64, epoch: String, hasMore: Bool)
    /// The newest notifications; the rest are paged from history with `next`.
    case reset([HeraldNotification], next: String?, cursor: Int64, epoch: String, preferences: Preferences?)
}

/// The device's HTTP routes (PROTOCOL.md 4): requests built and answers
/// read, no state. Errors are the gateway's (`.server`) or the transport's.
struct DeviceAPI: Sendable {
    let endpoint: Endpoint
    let transport: any HTTPTransport
    let deviceId: String

    /// `wait` 0 answers at once; `timeout` bounds the request, by default
    /// the wait and 15 s more.
    func sync(token: String, cursor: Int64?, epoch: String?, wait: Duration,
              timeout: Duration? = nil) async throws(HeraldClientError) -> SyncAnswer {
        // The gateway holds a poll up to 60 s.
        let seconds = min(60, max(0, wait.components.seconds))
        let query: [(String, String?)] = [("cursor", cursor.map(String.init)), ("epoch", cursor == nil ? nil : epoch),
                                          ("wait", String(seconds))]
        let o = try await call("GET", "/v1/me/sync", query, token: token, timeout: timeout ?? .seconds(seconds + 15))
        if o["reset"]?.boolValue == true {
            guard let list = o["notifications"]?.arrayValue, let cursor = o["cursor"]?.int64Value,
                  let epoch = o["epoch"]?.stringValue else { throw .badFrame("a malformed sync reset") }
            return .reset(try Self.notifications(list), next: o["next"]?.stringValue, cursor: cursor, epoch: epoch,
                          preferences: o["preferences"].flatMap(Preferences.init(json:)))
        }
        guard let list = o["changes"]?.arrayValue, let cursor = o["cursor"]?.int64Value,
              let epoch = o["epoch"]?.stringValue else { throw .badFrame("a malformed sync answer") }
        let changes = list.compactMap(Change.init(json:))
        guard changes.count == list.count else { throw .badFrame("a malformed change in a sync answer") }
        return .changes(changes, cursor: cursor, epoch: epoch, hasMore: o["hasMore"]?.boolValue ?? false)
    }

    func history(token: String, limit: Int, before: String?, readState: ReadState?,
                 userActionState: UserActionState?) async throws(HeraldClientError) -> HistoryPage {
        let o = try await call("GET", "/v1/me/notifications",
                               [("limit", String(limit)), ("before", before), ("readState", readState?.rawValue),
                                ("userActionState", userActionState?.rawValue)], token: token)
        guard let list = o["notifications"]?.arrayValue else { throw .badFrame("a malformed history page") }
        return HistoryPage(notifications: try Self.notifications(list), next: o["next"]?.stringValue)
    }

    func counts(token: String) async throws(HeraldClientError) -> Counts {
        let o = try await call("GET", "/v1/me/counts", [], token: token)
        guard let unread = o["unread"]?.int64Value, let fresh = o["noInteraction"]?.int64Value,
              let total = o["total"]?.int64Value else { throw .badFrame("malformed counts") }
        // A gateway before seenState: unseen as unread (read ones count as seen).
        let unseen = o["unseen"]?.int64Value ?? unread
        return Counts(unread: Int(unread), noInteraction: Int(fresh), total: Int(total), unseen: Int(unseen))
    }

    /// `all`: `read-all` or `seen-all`; answers how many notifications it marked.
    func markAll(_ all: String, token: String) async throws(HeraldClientError) -> Int {
        let o = try await call("POST", "/v1/me/notifications/" + all, [], token: token, body: .object(JSONObject()))
        guard let updated = o["updated"]?.int64Value else { throw .badFrame("a malformed \(all) answer") }
        return Int(updated)
    }

    func update(token: String, id: String, fields: JSONObject, ifVersion: Int64?) async throws(HeraldClientError) -> HeraldNotification {
        let o = try await call("PATCH", "/v1/me/notifications/" + Self.escape(id), [], token: token,
                               body: .object(fields), ifMatch: ifVersion)
        guard let n = o["notification"].flatMap(HeraldNotification.init(json:)) else {
            throw .badFrame("a malformed update answer")
        }
        return n
    }

    func delete(token: String, id: String) async throws(HeraldClientError) {
        _ = try await call("DELETE", "/v1/me/notifications/" + Self.escape(id), [], token: token)
    }

    func preferences(token: String) async throws(HeraldClientError) -> Preferences {
        try Self.preferences(try await call("GET", "/v1/me/preferences", [], token: token))
    }

    /// `body`: `{"default"?, "groups"?}` (SPEC section 12).
    func savePreferences(token: String, body: JSONObject, ifVersion: Int64?) async throws(HeraldClientError) -> Preferences {
        try Self.preferences(try await call("PUT", "/v1/me/preferences", [], token: token, body: .object(body), ifMatch: ifVersion))
    }

    private static func preferences(_ o: JSONObject) throws(HeraldClientError) -> Preferences {
        guard let p = o["preferences"].flatMap(Preferences.init(json:)) else { throw .badFrame("malformed preferences") }
        return p
    }

    /// Registers this device's push handle, or removes it (`.null`).
    func registerPush(token: String, push: JSON) async throws(HeraldClientError) {
        var body = JSONObject()
        body["push"] = push
        _ = try await call("PUT", "/v1/me/devices/" + Self.escape(deviceId), [], token: token, body: .object(body))
    }

    // MARK: Requests

    private func call(_ method: String, _ path: String, _ query: [(String, String?)], token: String,
                      body: JSON? = nil, ifMatch: Int64? = nil,
                      timeout: Duration = .seconds(30)) async throws(HeraldClientError) -> JSONObject {
        let pairs = query.compactMap { key, value in value.map { "\(key)=\(Self.escape($0))" } }
        var headers = [("Authorization", "Bearer " + token), ("Herald-Device", deviceId)]
        if body != nil { headers.append(("Content-Type", "application/json")) }
        if let ifMatch { headers.append(("If-Match", "\"\(ifMatch)\"")) }
        let request = HTTPRequest(method: method, target: path + (pairs.isEmpty ? "" : "?" + pairs.joined(separator: "&")),
                                  headers: headers, body: body?.encoded ?? [], timeout: timeout)
        let response: HTTPResponse
        do {
            response = try await transport.send(request, to: endpoint)
        } catch let error as HeraldClientError {
            throw error
        } catch is CancellationError {
            throw .cancelled
        } catch {
            throw .unreachable(String(describing: error))
        }
        let json = response.body.isEmpty ? JSON.object(JSONObject()) : try? JSONParser.parse(response.body)
        if (200..<300).contains(response.status), let o = json?.objectValue { return o }
        if let e = json?.objectValue?["error"]?.objectValue, let code = e["code"]?.stringValue {
            throw .server(code: code, message: e["message"]?.stringValue ?? "")
        }
        throw .server(code: "http_\(response.status)", message: String(decoding: response.body.prefix(200), as: UTF8.self))
    }

    private static func notifications(_ list: [JSON]) throws(HeraldClientError) -> [HeraldNotification] {
        let ns = list.compactMap(HeraldNotification.init(json:))
        guard ns.count == list.count else { throw .badFrame("a malformed notification in an answer") }
        return ns
    }

    /// Percent-encodes all but RFC 3986's unreserved characters.
    static func escape(_ s: String) -> String {
        var out = ""
        for byte in s.utf8 {
            switch byte {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"),
                 UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "_"),
                 UInt8(ascii: "~"):
                out.unicodeScalars.append(Unicode.Scalar(byte))
            default:
                out += "%" + String(byte, radix: 16, uppercase: true).leftPadded
            }
        }
        return out
    }
}

private extension String {
    var leftPadded: String { count == 1 ? "0" + self : self }
}
