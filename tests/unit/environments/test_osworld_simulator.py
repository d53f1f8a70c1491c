"""The desktop simulator (a stand-in for OSWorld's VMs) over real HTTP, through the client that
speaks OSWorld's controller API: screenshots are PNGs capped by the image policy, the tree and
``/execute`` behave as the real in-VM server's, and code is recognised, never run."""

from __future__ import annotations

import io
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from PIL import Image

from dockyard.environments.osworld.accessibility import parse_tree
from dockyard.environments.osworld.computer13 import parse_action, to_pyautogui
from dockyard.environments.osworld.controller_client import (
    ControllerUnavailable,
    DesktopController,
    SimulatorClient,
)
from dockyard.environments.osworld.tasks import parse_task
from dockyard.producers.multimodal import ImageInputError, normalize_image
from tests.osworld_simulator import simulator_command
from tests.sandbox_service import sandbox_service

DATA = Path(__file__).resolve().parents[3] / "configs" / "cpu" / "data" / "osworld.jsonl"
TASKS = {
    record["id"]: parse_task(record["task"])
    for record in map(json.loads, DATA.read_text().splitlines())
}


@pytest.fixture(scope="module")
def simulator_url() -> Iterator[str]:
    with sandbox_service(simulator_command("--max-desktops", "4")) as url:
        yield url


@pytest.fixture
async def simulator(simulator_url) -> AsyncIterator[SimulatorClient]:
    client = SimulatorClient(simulator_url, timeout_s=10)
    yield client
    await client.aclose()


def states(tree: str) -> dict[str, tuple[str, dict[str, str]]]:
    return {node.name: (node.text, node.states) for node in parse_tree(tree)}


async def test_actions_through_execute_change_what_the_tree_and_screenshot_show(simulator):
    desktop_id, desktop = await simulator.open_desktop(TASKS["osw-fill-name"])
    before = await desktop.screenshot()
    # The three clicks and the text, as OSWorld's controller sends them.
    for code in ("pyautogui.click(20, 20)", "pyautogui.write('Ada')", "pyautogui.click(200, 20)"):
        result = await desktop.execute_python(code)
        assert (result.ok, result.returncode, result.error) == (True, 0, "")
    tree = states(await desktop.accessibility_tree())
    assert tree["Name"][0] == "Ada"
    assert tree["Submit"][1]["focused"] == "true"  # the last click focused the button
    assert tree["Status"][0] == "Submitted"  # what the button's press sets
    assert await desktop.screenshot() != before
    assert await desktop.screen_size() == (320, 200)
    await simulator.close_desktop(desktop_id)
    with pytest.raises(ControllerUnavailable, match="404"):
        await desktop.accessibility_tree()


async def test_a_menu_opens_on_click_and_selects_the_option_clicked(simulator):
    desktop_id, desktop = await simulator.open_desktop(TASKS["osw-colour"])
    await desktop.execute_python("pyautogui.click(20, 20)")
    tree = states(await desktop.accessibility_tree())
    assert tree["Colour"][1]["expanded"] == "true"
    assert {"Red", "Green", "Blue"} <= tree.keys()  # the open menu lists its items
    # Options hang below the menu, one row of its height (24) each: y 82..105 is the third.
    await desktop.execute_python("pyautogui.click(20, 85)")
    tree = states(await desktop.accessibility_tree())
    assert tree["Colour"][0] == "Blue"
    assert tree["Colour"][1]["expanded"] == "false"
    await simulator.close_desktop(desktop_id)


async def test_the_screenshot_is_a_png_of_the_screen_capped_by_max_image_pixels(simulator):
    desktop_id, desktop = await simulator.open_desktop(TASKS["osw-agree"])
    png = await desktop.screenshot()
    with Image.open(io.BytesIO(png)) as image:
        assert (image.format, image.size) == ("PNG", (320, 200))
    # The worker's image gate decodes it under policy.generation.max_image_pixels ...
    assert normalize_image(png, max_image_pixels=320 * 200).size == (320, 200)
    # ... and refuses it, before decoding, when the screen is larger than the cap.
    with pytest.raises(ImageInputError):
        normalize_image(png, max_image_pixels=320 * 200 - 1)
    await simulator.close_desktop(desktop_id)


@pytest.mark.parametrize(
    "body",
    [
        {"command": "xdotool click 1", "shell": True},
        {"command": ["bash", "-c", "touch /tmp/x"], "shell": False},
        {"command": ["python", "-c", "__import__('os').system('id')"], "shell": False},
        {"command": ["python", "-c", "pyautogui.click(15, 15); import os"], "shell": False},
        {"command": ["python", "-c", "DONE"], "shell": False},
        {"command": ["python"], "shell": False},
        ["not", "an", "object"],
    ],
)
async def test_execute_refuses_what_is_not_pyautogui_code_and_changes_nothing(
    simulator, simulator_url, body
):
    desktop_id, desktop = await simulator.open_desktop(TASKS["osw-agree"])
    before = await desktop.accessibility_tree()
    async with httpx.AsyncClient() as client:
        reply = await client.post(f"{simulator_url}/desktops/{desktop_id}/execute", json=body)
    assert reply.status_code == 200
    answer = reply.json()
    assert (answer["status"], answer["returncode"]) == ("error", 1)
    assert answer["error"]
    # All or nothing: the click before the refused import was not applied either.
    assert await desktop.accessibility_tree() == before
    await simulator.close_desktop(desktop_id)


async def test_bad_setups_and_unknown_desktops_are_refused(simulator_url):
    async with httpx.AsyncClient() as client:
        bad = {"config": [{"type": "desktop", "parameters": {"widgets": []}}]}
        reply = await client.post(f"{simulator_url}/desktops", json=bad)
        assert reply.status_code == 400
        assert "widgets" in reply.json()["error"]
        reply = await client.post(f"{simulator_url}/desktops", content=b"{not json")
        assert reply.status_code == 400
        deep = b"[" * 100_000 + b"]" * 100_000  # past the JSON parser's depth
        assert (await client.post(f"{simulator_url}/desktops", content=deep)).status_code == 400
        huge = b'{"config": "' + b"x" * 300_000 + b'"}'  # over the body cap
        assert (await client.post(f"{simulator_url}/desktops", content=huge)).status_code == 400
        assert (await client.get(f"{simulator_url}/desktops/nope/screenshot")).status_code == 404
        assert (await client.delete(f"{simulator_url}/desktops/nope")).status_code == 404


async def test_a_full_simulator_refuses_new_desktops_instead_of_evicting(simulator):
    opened = [await simulator.open_desktop(TASKS["osw-agree"]) for _ in range(4)]
    with pytest.raises(ControllerUnavailable, match="503"):
        await simulator.open_desktop(TASKS["osw-agree"])
    for desktop_id, desktop in opened:
        assert "I agree" in await desktop.accessibility_tree()  # none was evicted
        await simulator.close_desktop(desktop_id)


async def test_the_client_refuses_a_controller_that_answers_outside_the_api():
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/screenshot":
            return httpx.Response(200, content=b"GIF89a not a png")
        if request.url.path == "/accessibility":
            return httpx.Response(200, json={"tree": "<x/>"})
        return httpx.Response(200, json={"status": "success"})

    # A stand-in controller (httpx's mock transport): what a misbehaving VM could answer.
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        desktop = DesktopController(client, "http://vm:5000")
        with pytest.raises(ControllerUnavailable, match="PNG"):
            await desktop.screenshot()
        with pytest.raises(ControllerUnavailable, match="AT"):
            await desktop.accessibility_tree()
        with pytest.raises(ControllerUnavailable, match="returncode"):
            await desktop.execute_python("pyautogui.click(1, 1)")


async def run_computer13(desktop: DesktopController, *actions: dict[str, object]) -> None:
    """Each action as OSWorld's controller runs a computer_13 action: one pyautogui command."""
    for action in actions:
        result = await desktop.execute_python(to_pyautogui(parse_action(action)))
        assert (result.ok, result.error) == (True, ""), action


async def test_computer_13_keys_held_down_modify_the_keys_pressed(simulator):
    desktop_id, desktop = await simulator.open_desktop(TASKS["osw-clear"])
    await run_computer13(
        desktop,
        {"action_type": "CLICK", "x": 20, "y": 20},  # focus Search ("old query")
        {"action_type": "KEY_DOWN", "key": "ctrl"},
        {"action_type": "PRESS", "key": "a"},  # ctrl held: select all, not the letter
        {"action_type": "KEY_UP", "key": "ctrl"},
        {"action_type": "TYPING", "text": "new"},  # replaces the selection
        {"action_type": "PRESS", "key": "b"},  # ctrl released: the letter
        {"action_type": "KEY_DOWN", "key": "shift"},
        {"action_type": "PRESS", "key": "c"},  # shift held: the capital
        {"action_type": "KEY_UP", "key": "shift"},
    )
    assert states(await desktop.accessibility_tree())["Search"][0] == "newbC"
    # '\t' is the tab key (pyautogui's name): the focus moves on to Go; '\n' presses it.
    await run_computer13(
        desktop,
        {"action_type": "PRESS", "key": "\t"},
        {"action_type": "PRESS", "key": "\n"},
    )
    tree = states(await desktop.accessibility_tree())
    assert tree["Go"][1]["focused"] == "true"
    assert tree["Search"][0] == "searching"  # what Go's press sets
    await simulator.close_desktop(desktop_id)


async def test_computer_13_mouse_buttons_click_only_when_released_where_pressed(simulator):
    desktop_id, desktop = await simulator.open_desktop(TASKS["osw-agree"])

    async def checked() -> str:
        return states(await desktop.accessibility_tree())["I agree"][1]["checked"]

    # Down and up on the box: a click, it ticks.
    await run_computer13(
        desktop,
        {"action_type": "MOVE_TO", "x": 15, "y": 15},
        {"action_type": "MOUSE_DOWN"},
        {"action_type": "MOUSE_UP", "button": "left"},
    )
    assert await checked() == "true"
    # Down on the box, released elsewhere (a drag off it): no click.
    await run_computer13(
        desktop,
        {"action_type": "MOUSE_DOWN"},
        {"action_type": "MOVE_TO", "x": 300, "y": 190},
        {"action_type": "MOUSE_UP"},
        {"action_type": "MOVE_TO", "x": 15, "y": 15},
        {"action_type": "DRAG_TO", "x": 300, "y": 190},
    )
    assert await checked() == "true"
    # Pressed off the box and dragged onto it: no click either.
    await run_computer13(desktop, {"action_type": "DRAG_TO", "x": 15, "y": 15})
    assert await checked() == "true"
    # The right button, a double click (two toggles), a scroll: still ticked; three clicks: not.
    await run_computer13(
        desktop,
        {"action_type": "RIGHT_CLICK", "x": 15, "y": 15},
        {"action_type": "MOUSE_DOWN", "button": "right"},
        {"action_type": "MOUSE_UP", "button": "right"},
        {"action_type": "DOUBLE_CLICK"},
        {"action_type": "SCROLL", "clicks": -5},
    )
    assert await checked() == "true"
    await run_computer13(desktop, {"action_type": "CLICK", "num_clicks": 3, "x": 20, "y": 20})
    assert await checked() == "false"
    await simulator.close_desktop(desktop_id)


def test_the_printed_url_accepts_a_connection_at_once():
    """The simulator listens before it prints its URL: a client that connects at once waits in
    the backlog while the server starts (it used to be refused: a bound socket that was not
    listening yet, seen as ConnectError under a loaded suite)."""
    import socket
    from urllib.parse import urlparse

    from tests.osworld_simulator import simulator_command
    from tests.sandbox_service import sandbox_service

    with sandbox_service(simulator_command()) as url:
        address = urlparse(url)
        with socket.create_connection((address.hostname, address.port), timeout=30):
            pass
