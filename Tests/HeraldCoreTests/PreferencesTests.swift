import XCTest
@testable import HeraldCore

/// The rules of SPEC section 12: resolution, the wire form both ways, and
/// what a save takes and refuses.
final class PreferencesTests: XCTestCase {
    func update(_ body: String, ifMatch: String? = nil) throws -> PreferencesUpdate {
        try PreferencesUpdate(bytes: Array(body.utf8), ifMatch: ifMatch)
    }

    func testAGroupsChannelThenTheDefaultsThenTrue() {
        let p = Preferences(default: Channels(push: false), groups: ["ads": Channels(inbox: false), "chat": Channels(push: true)])
        XCTAssertEqual(p.default, Channels(inbox: true, push: false), "a channel the default leaves out is true")
        XCTAssertFalse(p.allows(.inbox, group: "ads"))
        XCTAssertFalse(p.allows(.push, group: "ads"), "left out by the group: the default's")
        XCTAssertTrue(p.allows(.push, group: "chat"), "the group's own wins over the default")
        XCTAssertTrue(p.allows(.inbox, group: "other"))
        XCTAssertFalse(p.allows(.push, group: nil), "no group: the default")
        XCTAssertTrue(Preferences.unsaved.allows(.inbox, group: "x"))
        XCTAssertTrue(Preferences.unsaved.allows(.push, group: nil))
    }

    func testCriticalGroupsReachBothChannelsWhateverWasChosen() {
        let p = Preferences(default: Channels(inbox: false, push: false), groups: ["security": Channels(inbox: false, push: false)])
        XCTAssertFalse(p.allows(.inbox, group: "security"))
        let c = p.with(critical: ["security"])
        XCTAssertTrue(c.allows(.inbox, group: "security"))
        XCTAssertTrue(c.allows(.push, group: "security"))
        XCTAssertFalse(c.allows(.inbox, group: "other"))
        XCTAssertEqual(c.groups, p.groups, "the user's settings for it are kept")
    }

    func testTheWireFormRoundTrips() throws {
        let p = Preferences(default: Channels(inbox: false), groups: ["b": Channels(push: false), "a": Channels()],
                            critical: ["s"], version: 3, updatedAt: 1_800_000_000_000)
        XCTAssertEqual(p.json.encodedString,
                       #"{"default":{"inbox":false,"push":true},"groups":{"a":{},"b":{"push":false}},"critical":["s"],"version":3,"#
                       + #""updatedAt":"2027-01-15T08:00:00.000Z"}"#)
        XCTAssertEqual(Preferences(json: p.json), p)
        XCTAssertEqual(Preferences.unsaved.json.objectValue?["updatedAt"], .null)
        XCTAssertEqual(Preferences(json: Preferences.unsaved.json), .unsaved)
        XCTAssertNil(Preferences(json: ["default": [:], "groups": ["a": ["inbox": nil]], "version": 1]))
        XCTAssertNil(Preferences(json: ["default": [:], "groups": [:]]), "no version")
    }

    func testAPreferencesChangeRoundTripsAndReachesEveryViewer() throws {
        let p = Preferences(groups: ["ads": Channels(inbox: false)], critical: ["s"], version: 1, updatedAt: 5)
        let c = Change(seq: 7, op: .preferences(p))
        XCTAssertEqual(c.json.objectValue?.keys, ["seq", "op", "preferences"])
        XCTAssertEqual(Change(json: c.json), c)
        let r = ChangeRecord(change: c, before: nil, after: nil, at: 5)
        let device = Viewer(userId: "u", device: Device(deviceId: "d", platform: .ios, tags: ["x"], lastSeenAt: 0))
        XCTAssertEqual(r.bytes(for: device), c.json.encoded)
        XCTAssertEqual(r.bytes(for: .unnamed), c.json.encoded)
        XCTAssertNil(r.notificationJSON)
        XCTAssertEqual(r.badgeDelta(for: device), .zero)
        XCTAssertNil(PushMessage.plan(r, published: false, viewer: device, service: .apns, alert: nil, epoch: "e", now: 5),
                     "a save sends no push")
    }

    func testASaveReplacesWhatItGivesAndKeepsTheRest() throws {
        let saved = Preferences(default: Channels(push: false), groups: ["a": Channels(inbox: false)], version: 4, updatedAt: 1)
        let groupsOnly = try update(#"{"groups": {"b": {"push": false}}}"#).applied(to: saved, now: 9)
        XCTAssertEqual(groupsOnly.default, saved.default, "an absent key keeps what is saved")
        XCTAssertEqual(groupsOnly.groups, ["b": Channels(push: false)], "groups given replace the saved ones")
        XCTAssertEqual(groupsOnly.version, 5)
        XCTAssertEqual(groupsOnly.updatedAt, 9)
        let cleared = try update(#"{"groups": {}}"#).applied(to: saved, now: 9)
        XCTAssertEqual(cleared.groups, [:])
        let defaults = try update(#"{"default": {"inbox": false}}"#).applied(to: saved, now: 9)
        XCTAssertEqual(defaults.default, Channels(inbox: false, push: true), "the default given is whole; push left out is true")
        XCTAssertEqual(defaults.groups, saved.groups)
        XCTAssertEqual(try update(#"{"groups": {}}"#, ifMatch: "\"0\"").ifVersion, 0)
        XCTAssertEqual(try update(#"{"groups": {}}"#, ifMatch: "W/\"12\"").ifVersion, 12)
    }

    func testBadSavesAreRefusedWithAClearMessage() {
        let hundredAndOne = (0...100).map { "\"g\($0)\": {}" }.joined(separator: ",")
        let cases: [(String, String)] = [
            (#"{}"#, "give default or groups"),
            (#"{"default": null}"#, "default must not be null"),
            (#"{"groups": null}"#, "groups must not be null"),
            (#"{"groups": {"a": null}}"#, "groups.a must not be null"),
            (#"{"groups": {"a": {"push": null}}}"#, "groups.a.push must be true or false"),
            (#"{"default": {"inbox": null}}"#, "default.inbox must be true or false"),
            (#"{"groups": {"": {}}}"#, "a group name must be"),
            (#"{"groups": {"a": {"email": true}}}"#, "groups.a: unknown field \"email\""),
            (#"{"groups": {"a": []}}"#, "groups.a must be an object"),
            (#"{"groups": [], "default": {}}"#, "groups must be a JSON object"),
            (#"{"critical": ["x"]}"#, "unknown field \"critical\""),
            ("{\"groups\": {\(hundredAndOne)}}", "at most 100 groups"),
            (#"[1]"#, "body must be a JSON object"),
        ]
        for (body, message) in cases {
            XCTAssertThrowsError(try update(body), body) { e in
                let err = e as! HeraldError
                XCTAssertEqual(err.code, .badRequest, body)
                XCTAssertTrue(err.message.contains(message), "\(body): \(err.message)")
            }
        }
        let longName = String(repeating: "g", count: Limits.maxGroupNameBytes)
        XCTAssertNoThrow(try update("{\"groups\": {\"\(longName)\": {}}}"), "any groupName a publish takes")
        XCTAssertThrowsError(try update("{\"groups\": {\"\(longName)g\": {}}}"))
        for bad in ["*", "x", "\"-1\"", ""] {
            XCTAssertThrowsError(try update(#"{"groups": {}}"#, ifMatch: bad), bad)
        }
    }
}
