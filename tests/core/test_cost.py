"""Cost per 1M tokens (core/cost.py, core/prices.py): the arithmetic on hand-computed cells, the --price and
--gpu-hour parsers (one line for bad input), and the options' round trip through flags, sweep files and
session.toml."""

from __future__ import annotations

import argparse
import tomllib

import pytest
import tomli_w

from servescope.__main__ import main
from servescope.core.cost import cell_cost, is_api, is_gpu, with_cost
from servescope.core.errors import ServescopeError
from servescope.core.prices import ApiPrice, Prices, parse_gpu_hour, parse_price, prices_of_meta
from servescope.core.results import CellCost, CellResult, GpuWindow
from servescope.engine.spec import SweepConflict, SweepSpec, add_flags, add_workload_flag
from servescope.sessions.meta import SessionMeta


def _cell(out_tok: int = 500, in_tok: int = 1000, wall_s: float = 5.0, wh: float | None = None) -> CellResult:
    return CellResult(requests_ok=10, wall_s=wall_s, output_tokens_total=out_tok, input_tokens_total=in_tok,
                      output_tok_s=out_tok / wall_s, total_tok_s=(out_tok + in_tok) / wall_s,
                      gpu=GpuWindow(available=True, wh_per_1m_output_tokens=wh) if wh is not None else None)


# ---- the arithmetic, by hand ---------------------------------------------------------------------------
def test_api_cost_is_its_list_price_over_the_measured_token_mix() -> None:
    # 1,000 input and 500 output tokens at $2.50 / $10 per 1M: 0.0025 + 0.005 = $0.0075 spent;
    # per 1M output tokens 0.0075 / 500 x 1e6 = $15.00 (= 10 + 2.5 x 1000 / 500); per 1M tokens in all
    # 0.0075 / 1500 x 1e6 = $5.00
    c = cell_cost(_cell(), Prices(api=ApiPrice(2.5, 10.0)))
    assert c is not None
    assert c.usd_per_1m_output_tokens == pytest.approx(15.0)
    assert c.usd_per_1m_total_tokens == pytest.approx(5.0)
    assert c.basis.startswith("api list price") and "2.00 in tok per out tok" in c.basis
    assert is_api(c) and not is_gpu(c)


def test_gpu_cost_is_its_hourly_price_over_the_measured_throughput() -> None:
    # $3.60 an hour is $0.001 a second; 100 output tok/s (500 in 5 s): 1e-5 $ per output token = $10.00 per 1M;
    # 300 tok/s in all: $3.33 per 1M tokens
    c = cell_cost(_cell(), Prices(gpu_usd_per_hour=3.6))
    assert c is not None
    assert c.usd_per_1m_output_tokens == pytest.approx(10.0)
    assert c.usd_per_1m_total_tokens == pytest.approx(10.0 / 3)
    assert c.basis == "gpu-hour $3.60 at 100 output tok/s"
    assert is_gpu(c) and not is_api(c)


def test_gpu_cost_adds_the_measured_energy_at_the_electricity_price() -> None:
    # 2,000 Wh per 1M output tokens at $0.15/kWh: 2 kWh x 0.15 = $0.30 per 1M output tokens; output is a third of
    # the tokens, so $0.10 per 1M tokens in all
    c = cell_cost(_cell(wh=2000.0), Prices(gpu_usd_per_hour=3.6, electricity_usd_per_kwh=0.15))
    assert c is not None
    assert c.usd_per_1m_output_tokens == pytest.approx(10.30)
    assert c.usd_per_1m_total_tokens == pytest.approx(10.0 / 3 + 0.10)
    assert c.basis == "gpu-hour $3.60 at 100 output tok/s + energy 2,000 Wh/1M out tok at $0.15/kWh"
    # the energy not measured (no NVML): the hourly price alone, and the basis says so
    c = cell_cost(_cell(), Prices(gpu_usd_per_hour=3.6, electricity_usd_per_kwh=0.15))
    assert c is not None and c.usd_per_1m_output_tokens == pytest.approx(10.0)
    assert c.basis.endswith("(energy not measured)")


def test_energy_alone_is_a_cost_but_not_a_gpus() -> None:
    c = cell_cost(_cell(wh=2000.0), Prices(electricity_usd_per_kwh=0.15))
    assert c is not None
    assert (c.usd_per_1m_output_tokens, c.usd_per_1m_total_tokens) == (pytest.approx(0.30), pytest.approx(0.10))
    assert c.basis.startswith("energy only") and not is_gpu(c) and not is_api(c)
    assert cell_cost(_cell(), Prices(electricity_usd_per_kwh=0.15)) is None  # and no energy: nothing to price


def test_no_price_or_no_tokens_is_no_cost() -> None:
    assert cell_cost(_cell(), Prices()) is None
    assert cell_cost(_cell(out_tok=0, in_tok=0), Prices(api=ApiPrice(1, 1))) is None
    assert cell_cost(_cell(out_tok=0, in_tok=0), Prices(gpu_usd_per_hour=2.0)) is None
    assert cell_cost(CellResult(), Prices(gpu_usd_per_hour=2.0)) is None  # a cell without figures


def test_the_cost_is_stored_with_the_cell_and_read_back() -> None:
    r = with_cost(_cell(), Prices(gpu_usd_per_hour=3.6))
    d = r.to_dict()
    assert set(d["cost"]) == {"usd_per_1m_output_tokens", "usd_per_1m_total_tokens", "basis"}
    back = CellResult.from_dict(d)
    assert back.cost == r.cost and back.value("cost.usd_per_1m_output_tokens") == pytest.approx(10.0)
    assert "cost" not in _cell().to_dict()  # none: left out, as before
    kept = CellCost(usd_per_1m_output_tokens=1.0, basis="given")
    assert with_cost(CellResult(cost=kept), Prices(gpu_usd_per_hour=3.6)).cost is kept


def test_prices_as_session_toml_records_them() -> None:
    p = prices_of_meta(SessionMeta(price_usd_per_1m_input_tokens=2.5, price_usd_per_1m_output_tokens=10,
                                   gpu_usd_per_hour=-1.0, electricity_usd_per_kwh=float("nan")))
    assert p == Prices(api=ApiPrice(2.5, 10.0))
    assert prices_of_meta(SessionMeta(price_usd_per_1m_input_tokens=2.5)) == Prices()  # half a price is none


# ---- the parsers ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("text", ["input=2.50,output=10", " output=10 , input=$2.5 ", "INPUT=2.5;OUTPUT=10"])
def test_price_reads_both_prices(text: str) -> None:
    assert parse_price(text, "--price") == ApiPrice(2.5, 10.0)


def test_price_reads_a_sweep_files_table() -> None:
    assert parse_price({"input": 2.5, "output": 10}, "sweep.toml: [target] price") == ApiPrice(2.5, 10.0)


@pytest.mark.parametrize(("raw", "says"), [
    ("2.5,10", "'2.5' is not KEY=USD"),
    ("input=2.5", "no output price"),
    ("output=10", "no input price"),
    ("input=abc,output=1", "input 'abc' is not a number"),
    ("input=-1,output=2", "input must be a price of 0 to"),
    ("input=1,output=inf", "output must be a price of 0 to"),
    ("input=1,output=nan", "output must be a price of 0 to"),
    ("cached=1,input=1,output=2", "unknown price 'cached'"),
    ("input=1,input=2,output=3", "input is given twice"),
    ("", "empty"),
    ({"input": True, "output": 1}, "input must be a number"),
    (["input", 1], "must be the API's list price"),
])
def test_bad_price_is_one_line_that_says_what_to_write(raw: object, says: str) -> None:
    with pytest.raises(ServescopeError) as e:
        parse_price(raw, "--price")
    msg = e.value.message
    assert msg.startswith("--price: ") and says in msg and "\n" not in msg
    assert "input=" in msg  # the form to write


@pytest.mark.parametrize("raw", ["abc", "-1", "nan", "inf", "", True, [1]])
def test_bad_gpu_hour_is_one_line(raw: object) -> None:
    with pytest.raises(ServescopeError) as e:
        parse_gpu_hour(raw, "--gpu-hour")
    assert e.value.message.startswith("--gpu-hour: ") and "per hour" in e.value.message


def test_gpu_hour_reads_dollars() -> None:
    assert parse_gpu_hour("2.50", "--gpu-hour") == parse_gpu_hour("$2.50", "--gpu-hour") == 2.5
    assert parse_gpu_hour(3, "x") == 3.0


# ---- the options ---------------------------------------------------------------------------------------
def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_workload_flag(p)
    add_flags(p)
    return p.parse_args(list(argv))


def test_flags_reach_the_spec_and_a_sweep_file_keeps_them() -> None:
    spec = SweepSpec.from_args(_args("--price", "input=0.15,output=0.60"))
    assert spec.price == ApiPrice(0.15, 0.6)
    table = spec.to_table()
    assert table["target"]["price"] == {"input": 0.15, "output": 0.6}  # type: ignore[index]
    again = SweepSpec.from_table(tomllib.loads(tomli_w.dumps(table)))
    assert again.price == spec.price
    gpu = SweepSpec.from_args(_args("--gpu-hour", "2.5", "--electricity-price", "0.12"))
    assert (gpu.gpu_hour, gpu.electricity_price) == (2.5, 0.12)
    assert SweepSpec.from_table(tomllib.loads(tomli_w.dumps(gpu.to_table()))).gpu_hour == 2.5


def test_a_session_prices_one_side() -> None:
    with pytest.raises(SweepConflict) as e:
        SweepSpec.from_args(_args("--price", "input=1,output=2", "--gpu-hour", "2"))
    assert e.value.fields == ("gpu_hour", "price") and "not both" in e.value.message


def test_bad_price_flag_is_one_line_before_anything_runs(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["run", "--url", "sim://tiny", "--price", "2.5"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert "--price" in err and "input=2.50,output=10" in err
