"""The web chat page, in a real browser (Debian's chromium, headless, driven by
selenium): a long message typed key by key is prefilled while it is typed, Enter
streams the answer with its phase figures, and the timeline draws the requests.
A screenshot is kept in build/test-artifacts/."""
import json
import os
import shutil
import time
from pathlib import Path

import pytest

from harness import REPO

ARTIFACTS = Path(os.environ.get("TANDEM_ARTIFACTS", REPO / "build" / "test-artifacts"))
MESSAGE = ("I am writing a short report about lighthouses on the northern coast. Most of them were built in the "
           "nineteenth century from local stone, and many were automated in the nineteen sixties. "
           "Please describe what a lighthouse keeper did each day.")


def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    if not shutil.which("chromium") or not shutil.which("chromedriver"):
        if os.environ.get("CI") == "true":
            pytest.fail("chromium and chromium-driver are not installed (scripts/setup.sh)")
        pytest.skip("chromium and chromium-driver are not installed; run scripts/setup.sh")
    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium")
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,900",
              "--no-first-run", "--disable-extensions"):
        opts.add_argument(a)
    return webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=opts)


def wait_for(fn, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = fn()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_gemma_web_chat_page(gemma):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    status, headers, body = gemma.request("GET", "/")
    assert status == 200 and headers["Content-Type"].startswith("text/html") and b"<title>Tandem</title>" in body
    assert "frame-ancestors 'none'" in headers["Content-Security-Policy"]
    driver = browser()
    try:
        driver.get(gemma.base + "/")
        wait_for(lambda: "gemma-test" in driver.find_element(By.ID, "model").text, 30, "the model's name")
        box = driver.find_element(By.ID, "input")
        box.click()
        for ch in MESSAGE:  # key by key, as a person types
            box.send_keys(ch)
        # Prefilled while typing: the hint reports the tokens computed.
        hint = wait_for(lambda: (t := driver.find_element(By.ID, "hint").text).startswith("prefilled") and t, 60,
                        "the prefill while typing")
        assert "tokens" in hint
        # The timeline drew the prefills (checked now: it shows the last 20 s,
        # and a slow machine may take longer than that to answer).
        wait_for(lambda: driver.find_elements(By.CSS_SELECTOR, "#timeline rect.bar.prefill"), 10,
                 "prefill bars on the timeline")
        box.send_keys(Keys.ENTER)
        done = wait_for(lambda: driver.find_elements(By.CSS_SELECTOR, ".msg.assistant[data-done]"), 120,
                        "the streamed answer")
        answer = done[-1]
        assert answer.get_attribute("data-done") == "1", answer.text
        text = answer.find_element(By.CSS_SELECTOR, ".text").text
        assert len(text) > 10
        figures = wait_for(lambda: answer.find_element(By.CSS_SELECTOR, ".figures").text, 10, "the phase figures")
        assert "first token" in figures and "cached" in figures
        # Most of the prompt came from the prefill: far more cached than computed.
        cached = int(figures.split("(")[1].split(" cached")[0])
        computed = int(figures.split("prompt ")[1].split(" tok")[0])
        assert cached > 4 * computed, figures
        # The timeline drew the answer.
        wait_for(lambda: driver.find_elements(By.CSS_SELECTOR, "#timeline rect.bar.decode"), 10,
                 "decode bars on the timeline")
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(ARTIFACTS / "web_chat.png"))
        # Stop: a long answer is cut short by the button, and the server keeps serving.
        box.send_keys("Now write a very long story about the sea.")
        box.send_keys(Keys.ENTER)
        wait_for(lambda: len(driver.find_elements(By.CSS_SELECTOR, ".msg.assistant")) == 2, 10, "the second answer")
        time.sleep(0.5)
        driver.find_element(By.ID, "stop").click()
        second = wait_for(lambda: [m for m in driver.find_elements(By.CSS_SELECTOR, ".msg.assistant")[1:]
                                   if m.get_attribute("data-done")], 30, "the stopped answer")
        assert second[0].get_attribute("data-done") == "stopped"
    finally:
        driver.quit()
    status, _, body = gemma.request("GET", "/health")
    assert status == 200 and json.loads(body)["status"] == "ok"


def test_page_timeline_with_an_api_key():
    """With --api-key the page is served (it holds no data) and its timeline, like its calls, carries the key."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    from harness import STORIES, start_server

    srv = start_server(STORIES, "--api-key", "sekrit")
    try:
        status, _, _ = srv.request("GET", "/v1/timeline", timeout=10)
        assert status == 401
        status, _, body = srv.request("GET", "/", timeout=10)
        assert status == 200 and b"<title>Tandem</title>" in body
        driver = browser()
        try:
            driver.get(srv.base + "/")
            key = driver.find_element(By.ID, "api_key")
            key.send_keys("sekrit")
            key.send_keys(Keys.TAB)  # a change event: the page reconnects with the key
            wait_for(lambda: "stories260K" in driver.find_element(By.ID, "model").text, 30, "the model's name")
            client = srv.client(api_key="sekrit")

            def drawn():  # requests until the timeline (connected in the background) draws one
                r = client.completions.create(model="stories260K", prompt="Once upon a time", max_tokens=16)
                assert r.choices[0].text
                time.sleep(0.5)
                return driver.find_elements(By.CSS_SELECTOR, "#timeline rect.bar.decode")

            assert wait_for(drawn, 20, "decode bars on the timeline")
        finally:
            driver.quit()
    finally:
        assert srv.stop() == 0
