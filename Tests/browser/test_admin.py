"""The inspector's page (web-admin/, served at /admin) in headless Chromium,
against the real gateway pushing through the APNs stand-in
(Tests/e2e/push_standins.py): sign in with the app's server key, look up a
user, see their device and the push failure the stand-in scripted, and have
axe-core (axe-selenium-python) find no accessibility violation."""

from __future__ import annotations

import json
import sys
import urllib.request
import uuid

import pytest
from conftest import REPO_ROOT, SERVER_KEY, Gateway, _stop_checked, assert_accessible, pushing_gateway

sys.path.insert(0, str(REPO_ROOT / "Tests" / "e2e"))
from push_standins import APNsStandIn, Outcome  # noqa: E402

WAIT = 20.0
TOKEN = f"{uuid.uuid4().int:032x}{7:032x}"  # an APNs device token: 64 hex digits


@pytest.fixture(scope="module")
def pushing(browser_paths, tmp_path_factory):
    """The APNs stand-in, and a demo gateway whose `demo` app (the config file's) pushes through it."""
    with APNsStandIn(tmp_path_factory.mktemp("apns")) as apns:
        a = apns.describe()
        gw = pushing_gateway(tmp_path_factory.mktemp("herald"), {"apns": {
            "teamId": a["teamId"], "keyId": a["keyId"], "keyFile": a["keyFile"], "topic": a["topic"],
            "endpoint": apns.url, "developmentEndpoint": apns.url, "caFile": apns.ca_file}})
        yield gw, apns
        _stop_checked(gw)


def call(gw: Gateway, method: str, path: str, body: dict, bearer: str = SERVER_KEY) -> dict:
    req = urllib.request.Request(gw.url + path, method=method, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {bearer}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def test_signing_in_and_looking_up_a_user_shows_their_device_and_push_failure(pushing, driver):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    gw, apns = pushing
    user = f"u-{uuid.uuid4().hex[:8]}"
    token = call(gw, "POST", "/v1/apps/demo/tokens", {"userId": user})["token"]
    call(gw, "PUT", "/v1/me/devices/phone", {"platform": "ios", "push": {"service": "apns", "token": TOKEN}}, bearer=token)
    apns.script(Outcome(410, "Unregistered"), key=TOKEN)
    call(gw, "POST", f"/v1/apps/demo/users/{user}/notifications", {"appNotificationId": "n1", "payload": {"title": "t", "body": "b"}})

    wait = WebDriverWait(driver, WAIT)
    driver.get(gw.url + "/admin")
    driver.find_element(By.ID, "app-id").send_keys("demo")
    driver.find_element(By.ID, "server-key").send_keys(SERVER_KEY)
    driver.find_element(By.CSS_SELECTOR, "#sign-in-form button").click()
    wait.until(ec.visibility_of_element_located((By.ID, "user-form")))
    wait.until(ec.text_to_be_present_in_element((By.ID, "connections-table"), "websocket"))
    assert not driver.find_element(By.ID, "nodes-table").is_displayed(), "a single node has no presence records to show"
    assert driver.execute_script("return sessionStorage.getItem('herald-admin')"), "the key kept for the tab"
    driver.find_element(By.ID, "user-id").send_keys(user)
    submit = driver.find_element(By.CSS_SELECTOR, "#user-form button")
    submit.click()
    wait.until(ec.text_to_be_present_in_element((By.ID, "devices-table"), "phone"))

    def failure_shown(d):
        if "Unregistered" in d.find_element(By.ID, "devices-table").text:
            return True
        submit.click()  # the answer is the service's, in its time: look again until it shows
        return False
    wait.until(failure_shown)
    assert "handleRemoved (Unregistered)" in driver.find_element(By.ID, "devices-table").text
    assert "n1" in driver.find_element(By.ID, "notifications-table").text
    page = driver.page_source
    for secret in (TOKEN, SERVER_KEY, token):
        assert secret not in page, "a token, handle or key on the page"

    assert_accessible(driver)
