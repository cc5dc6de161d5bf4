import XCTest
import HeraldCore

/// The request validators of HeraldCore/Inputs.swift: every refusal is a
/// clear 400 (or 413 for a payload over 64 KiB), every acceptance obeys the
/// SPEC's limits, and an accepted request re-encodes to one that reads back
/// the same.
final class InputsFuzzTests: XCTestCase {

    static let jsonCorpora = ["publish", "bulk", "state", "device", "tokenrequest", "message", "json"]

    static func refusal(_ e: HeraldError, allowed: Set<ErrorCode> = [.badRequest]) -> Outcome {
        guard allowed.contains(e.code) else { return .failed("refused with \(e.code.rawValue) (\(e.message)), expected \(allowed.map(\.rawValue))") }
        guard !e.message.isEmpty else { return .failed("refused without a message") }
        return .rejected
    }

    // MARK: publish: NotificationDraft(reading:) via Fields

    static func readDraft(_ bytes: [UInt8]) throws(HeraldError) -> NotificationDraft {
        var f = try Fields(bytes: bytes)
        let d = try NotificationDraft(reading: &f)
        try f.finish()
        return d
    }

    static let publish = FuzzTarget(
        name: "publish", extraCorpora: jsonCorpora.filter { $0 != "publish" }, dictionary: wireWords, jsonAware: true,
        maxLength: 131072,
        check: { bytes in
            let d: NotificationDraft
            do throws(HeraldError) { d = try readDraft(bytes) } catch { return refusal(error, allowed: [.badRequest, .tooLarge]) }
            if let why = draftProblem(d) { return .failed(why) }
            // Building the notification must not trap whatever the expiry.
            let now: Millis = 1_795_341_600_000
            do throws(HeraldError) { _ = try d.notification(replacing: nil, userId: "alice", now: now) } catch {
                guard error.code == .badRequest, case .at = d.expiry else { return .failed("notification(replacing:) failed with \(error)") }
            }
            var o = JSONObject()
            encodeDraft(d, into: &o, withTags: true)
            guard let back = try? readDraft(JSON.object(o).encoded) else {
                return .failed("re-encoded draft is refused: \(JSON.object(o).encodedString.prefix(300))")
            }
            guard back == d || !expiryIsFormattable(d) else { return .failed("re-encoded draft reads back differently") }
            return .accepted
        })

    /// RFC3339.format writes 4-digit years only; the round trip is checked
    /// where the wire format can express the time.
    static func expiryIsFormattable(_ d: NotificationDraft) -> Bool {
        if case .at(let ms) = d.expiry { return TimeFuzzTests.formattable(ms) }
        return true
    }

    static func draftProblem(_ d: NotificationDraft) -> String? {
        if !Identifiers.isUserId(d.appNotificationId) { return "bad appNotificationId accepted: \(d.appNotificationId.debugDescription)" }
        if JSON.object(d.payload).encoded.count > Limits.maxPayloadBytes { return "payload over 64 KiB accepted" }
        if let g = d.groupName, g.isEmpty || g.utf8.count > Limits.maxGroupNameBytes { return "bad groupName accepted" }
        if let t = d.displayTimeToLive, !(0...Limits.maxExpirySeconds).contains(t) { return "displayTimeToLive \(t) accepted" }
        if let p = d.targetPlatforms, Set(p).count != p.count { return "duplicate targetPlatforms kept" }
        if let t = d.targetTags, let why = TagFuzzTests.expressionProblem(t) { return "targetTags: \(why)" }
        if case .ttl(let s) = d.expiry, !(1...Limits.maxExpirySeconds).contains(s) { return "ttlSeconds \(s) accepted" }
        return nil
    }

    static func encodeDraft(_ d: NotificationDraft, into o: inout JSONObject, withTags: Bool) {
        o["appNotificationId"] = .string(d.appNotificationId)
        o["payload"] = .object(d.payload)
        o["priority"] = .string(d.priority.rawValue)
        if let g = d.groupName { o["groupName"] = .string(g) }
        if let t = d.displayTimeToLive { o["displayTimeToLive"] = .int(t) }
        if let p = d.targetPlatforms { o["targetPlatforms"] = .array(p.map { .string($0.rawValue) }) }
        if withTags, let t = d.targetTags { o["targetTags"] = .string(t.source) }
        switch d.expiry {
        case .default: break
        case .ttl(let s): o["ttlSeconds"] = .int(s)
        case .at(let ms): o["expiresAt"] = .string(RFC3339.format(ms))
        }
    }

    func testFuzzNotificationDraft() { FuzzRunner.run(Self.publish, test: self) }

    // MARK: bulk: BulkSend(bytes:)

    static let bulk = FuzzTarget(
        name: "bulk", extraCorpora: jsonCorpora.filter { $0 != "bulk" }, dictionary: wireWords, jsonAware: true,
        maxLength: 65536,
        check: { bytes in
            let b: BulkSend
            do throws(HeraldError) { b = try BulkSend(bytes: bytes) } catch { return refusal(error, allowed: [.badRequest, .tooLarge]) }
            if let why = draftProblem(b.draft) { return .failed(why) }
            var o = JSONObject()
            switch b.audience {
            case .users(let users):
                guard (1...Limits.maxBulkUsers).contains(users.count) else { return .failed("\(users.count) users accepted") }
                guard Set(users.map { Array($0.utf8) }).count == users.count else { return .failed("duplicate users kept") }
                if let bad = users.first(where: { !Identifiers.isUserId($0) }) { return .failed("bad user id accepted: \(bad.debugDescription)") }
                o["userIds"] = .array(users.map(JSON.string))
            case .tags(let e):
                if let why = TagFuzzTests.expressionProblem(e) { return .failed("tagExpression: \(why)") }
                guard b.draft.targetTags == e else { return .failed("an app-wide send's targetTags is not its tagExpression") }
                o["tagExpression"] = .string(e.source)
            }
            encodeDraft(b.draft, into: &o, withTags: { if case .users = b.audience { true } else { false } }())
            guard let back = try? BulkSend(bytes: JSON.object(o).encoded) else {
                return .failed("re-encoded bulk send is refused: \(JSON.object(o).encodedString.prefix(300))")
            }
            guard back.audience == b.audience, back.draft == b.draft || !expiryIsFormattable(b.draft) else {
                return .failed("re-encoded bulk send reads back differently")
            }
            return .accepted
        })

    func testFuzzBulkSend() { FuzzRunner.run(Self.bulk, test: self) }

    // MARK: state: StateUpdate(bytes:ifMatch:)

    /// Input: the If-Match header on the first line (`~` for none), then the body.
    static func splitStateInput(_ bytes: [UInt8]) -> (ifMatch: String?, body: [UInt8]) {
        guard let nl = bytes.firstIndex(of: 0x0A) else { return (nil, bytes) }
        let head = Array(bytes[..<nl])
        return (head == [0x7E] ? nil : String(decoding: head, as: UTF8.self), Array(bytes[(nl + 1)...]))
    }

    /// An independent reading of `If-Match: "3"` (quotes and W/ optional).
    static func referenceIfMatch(_ s: String) -> Int64? {
        var b = Array(s.utf8)[...]
        while let f = b.first, f == 0x20 || f == 0x09 { b = b.dropFirst() }
        while let l = b.last, l == 0x20 || l == 0x09 { b = b.dropLast() }
        if b.starts(with: Array("W/".utf8)) { b = b.dropFirst(2) }
        if b.count >= 2, b.first == 0x22, b.last == 0x22 { b = b.dropFirst().dropLast() }
        guard !b.isEmpty, b.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }) else { return nil }
        guard let v = Int64(String(decoding: b, as: UTF8.self)), v >= 1 else { return nil }
        return v
    }

    static let state = FuzzTarget(
        name: "state", extraCorpora: ["message"], dictionary: wireWords + ["\"3\"", "W/", "W/\"7\"", "~\n", "\n", "0", "-1"],
        jsonAware: false,
        maxLength: 16384,
        check: { bytes in
            let (ifMatch, body) = splitStateInput(bytes)
            if let h = ifMatch {
                let mine = referenceIfMatch(h)
                let theirs = try? StateUpdate.parseIfMatch(h)
                if mine != theirs { return .failed("If-Match \(h.debugDescription): parseIfMatch gives \(theirs.map(String.init) ?? "an error"), expected \(mine.map(String.init) ?? "an error")") }
            }
            let u: StateUpdate
            do throws(HeraldError) { u = try StateUpdate(bytes: body, ifMatch: ifMatch) } catch { return refusal(error) }
            guard u.readState != nil || u.userActionState != nil else { return .failed("an update without a state") }
            guard (u.ifVersion == nil) == (ifMatch == nil) else { return .failed("ifVersion \(String(describing: u.ifVersion)) for If-Match \(String(describing: ifMatch))") }
            if let v = u.ifVersion, v < 1 { return .failed("ifVersion \(v)") }
            return .accepted
        })

    func testFuzzStateUpdate() { FuzzRunner.run(Self.state, test: self) }

    // MARK: device: DeviceRegistration(bytes:)

    static func registrationProblem(_ r: DeviceRegistration) -> String? {
        guard let tags = r.tags else { return nil }
        if tags.count > Limits.maxDeviceTags { return "\(tags.count) tags accepted" }
        if Set(tags.map { Array($0.utf8) }).count != tags.count { return "duplicate tags kept" }
        for t in tags {
            if !Identifiers.isTag(t) { return "bad tag accepted: \(t.debugDescription)" }
            if t.hasPrefix("user:") || t.hasPrefix("platform:") || t.hasPrefix("device:") { return "reserved tag accepted: \(t)" }
        }
        return nil
    }

    static let device = FuzzTarget(
        name: "device", extraCorpora: ["message"], dictionary: wireWords, jsonAware: true,
        maxLength: 65536,
        check: { bytes in
            let r: DeviceRegistration
            do throws(HeraldError) { r = try DeviceRegistration(bytes: bytes) } catch { return refusal(error) }
            if let why = registrationProblem(r) { return .failed(why) }
            var o = JSONObject()
            if let p = r.platform { o["platform"] = .string(p.rawValue) }
            if let t = r.tags { o["tags"] = .array(t.map(JSON.string)) }
            guard let back = try? DeviceRegistration(bytes: JSON.object(o).encoded), back == r else {
                return .failed("re-encoded registration reads back differently")
            }
            return .accepted
        })

    func testFuzzDeviceRegistration() { FuzzRunner.run(Self.device, test: self) }

    // MARK: tokenrequest: TokenRequest(bytes:)

    static let tokenRequest = FuzzTarget(
        name: "tokenrequest", extraCorpora: ["publish", "device"], dictionary: wireWords, jsonAware: true,
        maxLength: 16384,
        check: { bytes in
            let t: TokenRequest
            do throws(HeraldError) { t = try TokenRequest(bytes: bytes) } catch { return refusal(error) }
            guard Identifiers.isUserId(t.userId) else { return .failed("bad userId accepted: \(t.userId.debugDescription)") }
            guard TokenRequest.ttlRange.contains(t.ttlSeconds) else { return .failed("ttlSeconds \(t.ttlSeconds) accepted") }
            if let d = t.deviceId, !Identifiers.isUserId(d) { return .failed("bad deviceId accepted: \(d.debugDescription)") }
            let o: JSON = ["userId": .string(t.userId), "ttlSeconds": .int(t.ttlSeconds), "deviceId": t.deviceId.json]
            guard let back = try? TokenRequest(bytes: o.encoded), back.userId == t.userId,
                  back.ttlSeconds == t.ttlSeconds, back.deviceId == t.deviceId else {
                return .failed("re-encoded token request reads back differently")
            }
            return .accepted
        })

    func testFuzzTokenRequest() { FuzzRunner.run(Self.tokenRequest, test: self) }
}
