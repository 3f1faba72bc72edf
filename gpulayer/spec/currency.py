"""ISO 4217 active currency codes, so a typo such as "USd" or "EURO" is caught at submit."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator

_CODES = """
    AED AFN ALL AMD ANG AOA ARS AUD AWG AZN BAM BBD BDT BGN BHD BIF BMD BND BOB BOV BRL BSD
    BTN BWP BYN BZD CAD CDF CHE CHF CHW CLF CLP CNY COP COU CRC CUC CUP CVE CZK DJF DKK DOP
    DZD EGP ERN ETB EUR FJD FKP GBP GEL GHS GIP GMD GNF GTQ GYD HKD HNL HTG HUF IDR ILS INR
    IQD IRR ISK JMD JOD JPY KES KGS KHR KMF KPW KRW KWD KYD KZT LAK LBP LKR LRD LSL LYD MAD
    MDL MGA MKD MMK MNT MOP MRU MUR MVR MWK MXN MXV MYR MZN NAD NGN NIO NOK NPR NZD OMR PAB
    PEN PGK PHP PKR PLN PYG QAR RON RSD RUB RWF SAR SBD SCR SDG SEK SGD SHP SLE SLL SOS SRD
    SSP STN SVC SYP SZL THB TJS TMT TND TOP TRY TTD TWD TZS UAH UGX USD USN UYI UYU UYW UZS
    VED VES VND VUV WST XAF XAG XAU XBA XBB XBC XBD XCD XCG XDR XOF XPD XPF XPT XSU XUA XXX
    YER ZAR ZMW ZWG ZWL
"""

ISO_4217_CODES: frozenset[str] = frozenset(_CODES.split())


def check_currency(value: str) -> str:
    if value not in ISO_4217_CODES:
        raise ValueError(f"{value!r} is not an ISO 4217 currency code such as USD or EUR")
    return value


CurrencyCode = Annotated[str, AfterValidator(check_currency)]
