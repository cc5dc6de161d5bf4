import Foundation
import HeraldClient
import HeraldCore

/// `herald watch`: a HeraldClient on a terminal. Every client event is one
/// JSON line on stdout (`{"event": ...}`); every stdin command is answered by
/// one (`{"reply": ...}`). Lines are written whole, one at a time.
struct Watch {
    let client: HeraldClient

    /// Runs until `quit` (exit 0) or until the gateway refuses this device
    /// for good (close 4003 or 1008: exit 1). The end of stdin ends the
    /// commands, not the watch.
    func run() async -> Never {
        let events = Task {
            for await event in client.events {
                Self.write(Self.describe(event))
                if case .problem(.refused) = event { exit(1) }  // the client stopped for good
            }
        }
        await client.start()
        for await line in Self.stdinLines() {
            let words = line.split(whereSeparator: \.isWhitespace).map(String.init)
            guard !words.isEmpty else { continue }
            if words == ["quit"] {
                await client.stop()
                Self.write(["reply": "quit", "ok": true])
                exit(0)
            }
            Self.write(await answer(words))
        }
        await events.value  // the client's events end only with the client
        exit(0)
    }

    /// The answer to one command line (`dismiss n_...`, `prefs`).
    func answer(_ words: [String]) async -> JSONObject {
        var reply: JSONObject = ["reply": .string(words[0])]
        if let prefs = PrefsCommand(words) {
            return await answering(reply) { () async throws(HeraldClientError) in
                ["preferences": try await preferences(prefs).json]
            }
        }
        guard let action = Self.action(words) else {
            reply["ok"] = false
            reply["error"] = ["code": "bad_command", "message": .string(Self.usage)]
            return reply
        }
        reply["id"] = .string(words[1])
        return await answering(reply) { () async throws(HeraldClientError) in
            do {
                return try await action(client, words[1]).map { ["notification": $0.json] } ?? [:]
            } catch {
                throw error as? HeraldClientError ?? .server(code: "internal", message: "\(error)")
            }
        }
    }

    static let usage = "commands: read|unread|seen|activate|dismiss|snooze|delete ID, snooze ID UNTIL (RFC 3339 or +SECONDS), "
        + "prefs [GROUP inbox|push on|off], quit"

    /// `reply` with `ok` and what `body` gives, or its error.
    private func answering(_ reply: JSONObject, _ body: () async throws(HeraldClientError) -> JSONObject) async -> JSONObject {
        var reply = reply
        do {
            for (k, v) in try await body().pairs { reply[k] = v }
            reply["ok"] = true
        } catch {
            reply["ok"] = false
            reply["error"] = .object(Self.describe(error))
        }
        return reply
    }

    /// `prefs`, or `prefs GROUP inbox|push on|off`.
    enum PrefsCommand {
        case show
        case set(group: String, Channel, Bool)

        init?(_ words: [String]) {
            guard words[0] == "prefs" else { return nil }
            if words.count == 1 { self = .show; return }
            guard words.count == 4, let channel = Channel(rawValue: words[2]), ["on", "off"].contains(words[3]) else { return nil }
            self = .set(group: words[1], channel, words[3] == "on")
        }
    }

    /// The user's preferences, after setting one group's channel if asked:
    /// on the version read, so a save elsewhere meanwhile is refused, not lost.
    private func preferences(_ command: PrefsCommand) async throws(HeraldClientError) -> Preferences {
        let current = try await client.fetchPreferences()
        guard case .set(let group, let channel, let on) = command else { return current }
        var groups = current.groups
        switch channel {
        case .inbox: groups[group, default: Channels()].inbox = on
        case .push: groups[group, default: Channels()].push = on
        }
        return try await client.savePreferences(groups: groups, ifVersion: current.version)
    }

    /// Throws `HeraldClientError` only (typed throws do not infer in these closures).
    typealias Action = @Sendable (HeraldClient, String) async throws -> HeraldNotification?

    /// The action `words` ask for: a verb and an id, or `snooze ID UNTIL`.
    static func action(_ words: [String]) -> Action? {
        if words.count == 3, words[0] == "snooze" {
            guard let until = snoozeTime(words[2]) else { return nil }
            return { try await $0.snooze($1, until: until) }
        }
        return words.count == 2 ? actions[words[0]] : nil
    }

    /// `2026-12-03T10:00:00.000Z`, or `+90` for 90 seconds from now.
    static func snoozeTime(_ text: String) -> Millis? {
        if text.hasPrefix("+") {
            // Bounded so the product cannot overflow; the gateway refuses past 365 days.
            return Int64(text.dropFirst()).flatMap { (1...100 * 365 * 86_400).contains($0) ? WallClock.now() + $0 * 1000 : nil }
        }
        return RFC3339.parse(text)
    }

    static let actions: [String: Action] = [
        "read": { try await $0.markRead($1) },
        "unread": { try await $0.markUnread($1) },
        "seen": { try await $0.markSeen($1) },
        "activate": { try await $0.activate($1) },
        "dismiss": { try await $0.dismiss($1) },
        "snooze": { try await $0.snooze($1) },
        "delete": { try await $0.delete($1); return nil },
    ]

    // MARK: JSON lines

    static func describe(_ event: HeraldClient.Event) -> JSONObject {
        switch event {
        case .upserted(let n):
            return ["event": "upserted", "notification": n.json]
        case .removed(let id, let reason):
            return ["event": "removed", "id": .string(id), "reason": .string(reason.rawValue)]
        case .reset(let all):
            return ["event": "reset", "count": .int(Int64(all.count)), "ids": .array(all.map { .string($0.id) })]
        case .unread(let count):
            return ["event": "unread", "count": .int(Int64(count))]
        case .preferences(let p):
            return ["event": "preferences", "preferences": p.json]
        case .connection(let state):
            var o: JSONObject = ["event": "connection"]
            switch state {
            case .connecting: o["state"] = "connecting"
            case .live(let transport):
                o["state"] = "live"
                o["transport"] = .string(transport)
            case .offline(let retry):
                o["state"] = "offline"
                // Milliseconds until the next attempt; null: stopped.
                o["retryInMs"] = retry.map { .int(Int64(max(.zero, $0 - .now) / .milliseconds(1))) } ?? .null
            }
            return o
        case .problem(let error):
            return ["event": "problem", "error": .object(describe(error))]
        }
    }

    /// `{"code", "message"}`: the gateway's code for what it refused, a
    /// snake_case name of the case for the client's own errors.
    static func describe(_ error: HeraldClientError) -> JSONObject {
        func o(_ code: String, _ message: String, closeCode: Int? = nil) -> JSONObject {
            var o: JSONObject = ["code": .string(code), "message": .string(message)]
            if let closeCode { o["closeCode"] = .int(Int64(closeCode)) }
            return o
        }
        switch error {
        case .server(let code, let message): return o(code, message)
        case .notConnected: return o("not_connected", "no live connection")
        case .disconnected: return o("disconnected", "the connection closed before the gateway answered")
        case .refused(let code, let reason): return o("refused", reason, closeCode: code)
        case .connectionLost(let code, let reason): return o("connection_lost", reason, closeCode: code)
        case .badFrame(let m): return o("bad_frame", m)
        case .unknownFrame(let type): return o("unknown_frame", type)
        case .tokenUnavailable(let m): return o("token_unavailable", m)
        case .stateFile(let m): return o("state_file", m)
        case .badURL(let url): return o("bad_url", url)
        case .unreachable(let m): return o("unreachable", m)
        case .cancelled: return o("cancelled", "the request was abandoned")
        }
    }

    private static let output = NSLock()

    static func write(_ o: JSONObject) {
        let line = Data((JSON.object(o).encodedString + "\n").utf8)
        output.withLock { FileHandle.standardOutput.write(line) }
    }

    /// stdin's lines, read on a thread of their own (a blocking read must
    /// not hold one of the few threads Swift concurrency runs on).
    static func stdinLines() -> AsyncStream<String> {
        let (lines, sink) = AsyncStream.makeStream(of: String.self)
        Thread.detachNewThread {
            while let line = readLine() { sink.yield(line) }
            sink.finish()
        }
        return lines
    }
}
