"""A test MCP server (official SDK, FastMCP, stdio) with 40 tools: 36 lab-data tools with
schemas of the size real servers send (typed arguments with descriptions, enums, a nested
options object: ~560 tokens each, near the GitHub MCP server's ~500), and four that
misbehave on purpose (crash, hang, a malformed result, a 10 MB result); ``--extras`` adds
two (``slow_steps`` reports progress, ``spectrum_plot`` returns an image). ``--fail-start``
exits before speaking the protocol; ``--fail-start-if PATH`` does so while PATH exists;
``--http PORT --token T`` serves streamable HTTP on 127.0.0.1 to requests bearing T.

Run by the tests as ``python tests/mcp_servers/forty_tools.py``; stdout is the protocol,
so nothing here prints.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Literal

import anyio

# jsonschema (under the SDK) builds an IRI grammar at import when rfc3987_syntax is
# installed: 1.4 of this server's 2.2 CPU-s start, for a check it never makes (as
# simagent.cli.entry does)
sys.modules.setdefault("rfc3987_syntax", None)

from mcp.server.fastmcp import Context, FastMCP  # noqa: E402
from pydantic import BaseModel, Field  # noqa: E402

mcp = FastMCP("forty", log_level="WARNING")

#: (name, what it returns, the quantity's unit): 36 tools, each with the same shape of
#: arguments a real lab-data server would take.
_TOPICS = [
    ("molar_mass", "the molar mass of a species", "g/mol"),
    ("boiling_point", "the normal boiling point of a species", "K"),
    ("melting_point", "the melting point of a species", "K"),
    ("critical_temperature", "the critical temperature of a species", "K"),
    ("critical_pressure", "the critical pressure of a species", "Pa"),
    ("heat_capacity", "the isobaric heat capacity of a species at a temperature", "J/mol/K"),
    ("enthalpy_formation", "the standard enthalpy of formation of a species", "kJ/mol"),
    ("entropy_standard", "the standard molar entropy of a species", "J/mol/K"),
    ("gibbs_formation", "the standard Gibbs energy of formation of a species", "kJ/mol"),
    ("vapor_pressure", "the vapour pressure of a species at a temperature (Antoine)", "Pa"),
    ("density_liquid", "the liquid density of a species at a temperature", "kg/m3"),
    ("viscosity_gas", "the dynamic viscosity of a gas at a temperature", "Pa s"),
    ("viscosity_liquid", "the dynamic viscosity of a liquid at a temperature", "Pa s"),
    ("thermal_conductivity", "the thermal conductivity of a species at a temperature", "W/m/K"),
    ("diffusion_coefficient", "the binary diffusion coefficient of two gases", "m2/s"),
    ("surface_tension", "the surface tension of a liquid at a temperature", "N/m"),
    ("dielectric_constant", "the relative permittivity of a liquid", "1"),
    ("refractive_index", "the refractive index of a liquid at 589 nm", "1"),
    ("speed_of_sound", "the speed of sound in a gas at a temperature", "m/s"),
    ("ionization_energy", "the first ionization energy of an element", "eV"),
    ("electron_affinity", "the electron affinity of an element", "eV"),
    ("electronegativity", "the Pauling electronegativity of an element", "1"),
    ("atomic_radius", "the covalent radius of an element", "pm"),
    ("lattice_constant", "the lattice constant of a crystal", "angstrom"),
    ("band_gap", "the band gap of a semiconductor at 300 K", "eV"),
    ("youngs_modulus", "the Young's modulus of a material", "GPa"),
    ("yield_strength", "the yield strength of a material", "MPa"),
    ("thermal_expansion", "the linear thermal expansion coefficient of a material", "1/K"),
    ("specific_heat_solid", "the specific heat of a solid at a temperature", "J/kg/K"),
    ("electrical_resistivity", "the electrical resistivity of a material at a temperature",
     "ohm m"),
    ("magnetic_susceptibility", "the magnetic susceptibility of a material", "1"),
    ("half_life", "the half-life of a radioactive isotope", "s"),
    ("decay_energy", "the decay energy of a radioactive isotope", "MeV"),
    ("reaction_rate", "the Arrhenius rate constant of a reaction at a temperature", "1/s"),
    ("equilibrium_constant", "the equilibrium constant of a reaction at a temperature", "1"),
    ("flame_speed", "the laminar flame speed of a fuel-air mixture", "m/s"),
]


def _value(topic: str, subject: str, temperature_k: float) -> float:
    """A deterministic stand-in for a database lookup."""
    seed = sum(ord(c) for c in f"{topic}:{subject}")
    return round((seed % 997) / 10 + temperature_k / 1000, 4)


Table = Literal["nist", "crc", "dippr", "yaws", "janaf"]
Phase = Literal["gas", "liquid", "solid", "any"]
Interp = Literal["linear", "cubic", "nearest"]


class Conditions(BaseModel):
    """State and lookup options, as real property servers take them."""

    pressure_pa: float = Field(101_325.0, description="Pressure in pascal.")
    phase: Phase = Field("any", description="Phase the value refers to.")
    interpolation: Interp = Field("linear", description="How to interpolate between "
                                  "tabulated temperatures.")
    extrapolate: bool = Field(False, description="Allow values outside the table's range "
                              "(flagged in the answer).")


def _make(topic: str, what: str, unit: str) -> None:
    def lookup(
        subject: Annotated[str, Field(description="Species, element, material, isotope or "
                                      "reaction, by formula or common name (e.g. 'H2O', "
                                      "'CH4 + 2 O2 -> CO2 + 2 H2O', 'Si', 'U-235').")],
        temperature_k: Annotated[float, Field(description="Temperature in kelvin where the "
                                              "value depends on it.", gt=0)] = 298.15,
        source: Annotated[Table, Field(description="Reference table to read.")] = "nist",
        uncertainty: Annotated[bool, Field(description="Also return the table's stated "
                                           "uncertainty.")] = False,
        conditions: Annotated[Conditions | None, Field(description="Pressure, phase and "
                                                       "interpolation options.")] = None,
    ) -> str:
        value = _value(topic, subject, temperature_k)
        extra = f" +/- {value / 100:.4f}" if uncertainty else ""
        return f"{topic}({subject}, T={temperature_k:g} K, {source}) = {value}{extra} {unit}"

    lookup.__name__ = topic
    mcp.tool(name=topic, description=(
        f"Look up {what} in the lab's reference tables. Returns one line with the value in "
        f"{unit}, the conditions it holds at and the table it came from; with "
        f"`uncertainty` also the table's stated uncertainty. Use it instead of values "
        f"from memory when a number feeds a calculation. Example: "
        f"{topic}(subject='H2O', temperature_k=350) -> '{topic}(H2O, T=350 K, nist) = "
        f"... {unit}'."))(lookup)


for _t in _TOPICS:
    _make(*_t)


@mcp.tool()
async def crash_now(reason: str = "test") -> str:
    """Fault injection: the server process exits in the middle of this call."""
    os._exit(3)


@mcp.tool()
async def hang_forever(reason: str = "test") -> str:
    """Fault injection: never answers (the client's timeout must end the call)."""
    await anyio.sleep(3600)
    return "unreachable"


@mcp.tool()
async def malformed_result(ctx: Context) -> str:
    """Fault injection: answers this request with a result that is not a tool result."""
    rid = ctx.request_id
    line = json.dumps({"jsonrpc": "2.0", "id": int(rid) if str(rid).isdigit() else rid,
                       "result": {"content": "not a list of blocks", "isError": "perhaps"}})
    sys.stdout.buffer.write(line.encode() + b"\n")
    sys.stdout.buffer.flush()
    await anyio.sleep(0.5)
    return "the real answer, sent after the malformed one"


async def slow_steps(ctx: Context, steps: int = 3, gate: str = "") -> str:
    """Counts ``steps`` steps, reporting progress after each (``k/steps``, message
    ``step k``); with ``gate`` a path, each step waits until that file holds k, so a
    test paces it without sleeping."""
    for k in range(1, steps + 1):
        if gate:
            while not (os.path.exists(gate) and Path(gate).read_text().strip() == str(k)):
                await anyio.sleep(0.02)
        await ctx.report_progress(k, steps, f"step {k}")
    return f"counted {steps} steps"


#: A 2x1 PNG (one red, one blue pixel), made with zlib at import: no image library needed.
def _png() -> bytes:
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    raw = b"\x00" + bytes([255, 0, 0, 0, 0, 255])
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 2, 1, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


async def spectrum_plot(subject: str = "H2O") -> list:
    """Returns a plot of a species' spectrum as a PNG image, after a caption line."""
    from mcp.server.fastmcp import Image

    return [f"spectrum of {subject}", Image(data=_png(), format="png")]


@mcp.tool()
async def ten_megabytes(line: str = "row") -> str:
    """Fault injection: returns 10 MB of text (numbered lines, a marker in the middle)."""
    rows = [f"{line} {i:07d} value={i * 0.5:.1f}" for i in range(400_000)]
    rows[200_000] = "MIDDLE-MARKER found at row 200000"
    text = "\n".join(rows)
    return text + "\n" + "z" * max(0, 10_000_000 - len(text))


if __name__ == "__main__":
    if "--extras" in sys.argv:
        mcp.tool()(slow_steps)
        mcp.tool()(spectrum_plot)
    marker = sys.argv[sys.argv.index("--fail-start-if") + 1] \
        if "--fail-start-if" in sys.argv else None
    if "--fail-start" in sys.argv or (marker and os.path.exists(marker)):
        print("forty_tools: refusing to start (--fail-start)", file=sys.stderr)
        sys.exit(2)
    if "--http" in sys.argv:  # streamable HTTP on 127.0.0.1:PORT, bearer token required
        import hmac

        import uvicorn

        port = int(sys.argv[sys.argv.index("--http") + 1])
        token = ("Bearer " + sys.argv[sys.argv.index("--token") + 1]).encode()
        app = mcp.streamable_http_app()

        async def guarded(scope, receive, send):  # type: ignore[no-untyped-def]
            auth = dict(scope.get("headers") or []).get(b"authorization", b"")
            if scope["type"] == "http" and not hmac.compare_digest(auth, token):
                await send({"type": "http.response.start", "status": 401, "headers": []})
                return await send({"type": "http.response.body", "body": b"unauthorized"})
            await app(scope, receive, send)

        uvicorn.run(guarded, host="127.0.0.1", port=port, log_level="warning")
    else:
        mcp.run(transport="stdio")
