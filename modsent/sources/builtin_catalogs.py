"""Readers for the human-translated catalogs that pinned PyPI packages ship.

The offline demo data of the workflow (:mod:`modsent.sources.builtin`) is made of real text
that people wrote and translated, taken from files inside installed packages:

- Django's gettext catalogs (``django/conf/locale`` and ``django/contrib/*/locale``):
  user-interface messages of the framework and its contrib apps, translated on Transifex;
- django-allauth's gettext catalog: messages of its sign-up / log-in / e-mail pages;
- pycountry's gettext catalogs of the iso-codes project: names of countries (short, official
  and common names), subdivisions, languages, currencies and scripts;
- Babel's copy of the Unicode CLDR: names of territories, languages, scripts, currencies,
  time zones, exemplar cities, units, months and weekdays.

Every reader returns :class:`Unit` objects: one source text with its English form and its
translations in the languages of :data:`SUPPORTED_LANGUAGES`. Nothing here selects, splits or
cleans; :mod:`modsent.sources.builtin` does that. Reading never imports the packages' code
beyond locating their files (Django and allauth are not set up or imported for their apps).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import re
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from modsent.io import InputError

#: Languages the built-in data is read for: the 23 languages of the paper (ISO 639-1), of
#: which ``ha`` and ``rw`` only have names from pycountry / CLDR.
SUPPORTED_LANGUAGES: tuple[str, ...] = (
    "am", "ar", "az", "cs", "de", "en", "es", "fr", "ha", "it", "kk", "ko", "ky", "mr",
    "nl", "pl", "ru", "rw", "te", "tr", "ug", "uz", "zh",
)

# Locale directory / locale id of a language in each source where it differs from the code.
# Chinese is Simplified Chinese everywhere; Uzbek is the Latin-script default of each source.
_GETTEXT_LOCALE = {"zh": "zh_Hans"}          # Django and django-allauth
_PYCOUNTRY_LOCALE = {"zh": "zh_CN"}
_CLDR_LOCALE: dict[str, str] = {}            # Babel: "zh" is zh_Hans, "uz" is uz_Latn


@dataclass(frozen=True)
class Unit:
    """One source text (a catalog message or a named thing) and its human translations.

    ``english`` is the text as the source writes it (with placeholders and markup, if any);
    ``translations`` maps a language code to the translation the source gives for ``english``;
    ``variants`` holds further real forms that belong to the same message (the English plural
    and every plural form of a translation) as ``(lang, text)`` pairs: they feed the
    monolingual corpus only, never an aligned product.
    """

    source: str          # "django", "django-allauth", "pycountry", "cldr"
    catalog: str         # "django/contrib/admin:djangojs", "pycountry:iso3166-1", "cldr:languages"
    key: str             # unique inside the catalog
    group: str           # what is named, shared across catalogs ("territory:DE"); "" for messages
    domain: str          # "interface", "country", "region", "subdivision", "language", ...
    english: str
    translations: tuple[tuple[str, str], ...]
    variants: tuple[tuple[str, str], ...] = ()
    plural: bool = False

    def translation(self, lang: str) -> str | None:
        for code, text in self.translations:
            if code == lang:
                return text
        return None


# --------------------------------------------------------------------------------------------
# gettext .mo files


@dataclass(frozen=True)
class MoMessage:
    """One message of a compiled gettext catalog."""

    context: str | None
    msgid: str
    msgid_plural: str | None
    msgstr: tuple[str, ...]      # one string, or one per plural form


def read_mo(path: str | Path) -> list[MoMessage]:
    """Parse a GNU ``.mo`` file (both byte orders), header entry left out.

    The standard library's :class:`gettext.GNUTranslations` drops ``msgid_plural``; this
    small parser keeps every field, in file order (sorted by msgid, as msgfmt writes them).
    """
    path = Path(path)
    data = path.read_bytes()
    if len(data) < 28:
        raise InputError(f"{path}: not a gettext .mo file (only {len(data)} bytes)")
    magic = struct.unpack("<I", data[:4])[0]
    if magic == 0x950412DE:
        order = "<"
    elif magic == 0xDE120495:
        order = ">"
    else:
        raise InputError(f"{path}: not a gettext .mo file (magic number {magic:#x})")
    _version, count, originals, translations = struct.unpack(order + "4I", data[4:20])
    raw: list[tuple[bytes, bytes]] = []
    try:
        for i in range(count):
            olen, ooff = struct.unpack_from(order + "2I", data, originals + 8 * i)
            tlen, toff = struct.unpack_from(order + "2I", data, translations + 8 * i)
            if ooff + olen > len(data) or toff + tlen > len(data):
                raise struct.error("a string runs past the end of the file")
            raw.append((data[ooff:ooff + olen], data[toff:toff + tlen]))
    except struct.error as err:
        raise InputError(f"{path}: truncated or corrupt gettext .mo file ({err})") from None
    charset = "utf-8"
    for original, translated in raw:
        if original == b"":
            for line in translated.decode("ascii", "replace").splitlines():
                if line.lower().startswith("content-type:") and "charset=" in line:
                    charset = line.split("charset=", 1)[1].strip() or "utf-8"
    messages = []
    for original, translated in raw:
        if original == b"":
            continue
        try:
            text_o = original.decode(charset)
            text_t = translated.decode(charset)
        except (UnicodeDecodeError, LookupError) as err:
            raise InputError(f"{path}: cannot decode a message as {charset}: {err}") from None
        context = None
        if "\x04" in text_o:
            context, text_o = text_o.split("\x04", 1)
        msgid, _, msgid_plural = text_o.partition("\x00")
        messages.append(MoMessage(context, msgid, msgid_plural or None,
                                  tuple(text_t.split("\x00"))))
    return messages


# The packages whose translation catalogs the built-in data reads: import name -> distribution.
# All but pycountry (also the language registry's) are the `demo` extra: pip install 'modsent[demo]'.
CATALOG_PACKAGES = {"django": "Django", "allauth": "django-allauth", "babel": "babel", "pycountry": "pycountry"}
DEMO_EXTRA_HINT = "pip install 'modsent[demo]' (./run demo and ./run test install it)"


def missing_catalog_packages() -> list[str]:
    """The distributions of CATALOG_PACKAGES that are not installed (found without importing them)."""
    return [dist for name, dist in CATALOG_PACKAGES.items() if importlib.util.find_spec(name) is None]


def _package_dir(package: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise InputError(
            f"the built-in demo data needs the Python package {CATALOG_PACKAGES.get(package, package)!r}, "
            f"which is not installed: {DEMO_EXTRA_HINT}"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def _gettext_units(source: str, catalog: str, files: dict[str, Path]) -> list[Unit]:
    """Merge one catalog's ``.mo`` files (one per language) into units keyed by msgctxt+msgid."""
    merged: dict[tuple[str | None, str], dict] = {}
    for lang in sorted(files):
        for message in read_mo(files[lang]):
            forms = [form for form in message.msgstr if form.strip()]
            if not forms:
                continue
            slot = merged.setdefault((message.context, message.msgid), {
                "plural": message.msgid_plural, "translations": {}, "variants": []})
            slot["translations"][lang] = forms[0]
            slot["variants"].extend((lang, form) for form in forms[1:])
    units = []
    for (context, msgid), slot in sorted(merged.items(), key=lambda kv: (kv[0][1], kv[0][0] or "")):
        if not msgid.strip():
            continue
        variants = list(slot["variants"])
        if slot["plural"]:
            variants.insert(0, ("en", slot["plural"]))
        units.append(Unit(
            source=source, catalog=catalog,
            key=f"{context}\x04{msgid}" if context is not None else msgid,
            group="", domain="interface", english=msgid,
            translations=tuple(sorted(slot["translations"].items())),
            variants=tuple(variants), plural=slot["plural"] is not None,
        ))
    return units


def _gettext_catalog_files(
    locale_root: Path, domain: str, languages: Iterable[str], locales: dict[str, str] = _GETTEXT_LOCALE
) -> dict[str, Path]:
    files = {}
    for lang in languages:
        path = locale_root / locales.get(lang, lang) / "LC_MESSAGES" / f"{domain}.mo"
        if lang != "en" and path.is_file():
            files[lang] = path
    return files


def django_units(languages: Iterable[str] = SUPPORTED_LANGUAGES) -> list[Unit]:
    """UI messages of Django core and its contrib apps (``django.mo`` and ``djangojs.mo``)."""
    languages = tuple(languages)
    root = _package_dir("django")
    roots = [("django/conf", root / "conf" / "locale")]
    roots += [(f"django/contrib/{app.name}", app / "locale")
              for app in sorted((root / "contrib").iterdir()) if (app / "locale").is_dir()]
    units = []
    for name, locale_root in roots:
        for domain in ("django", "djangojs"):
            files = _gettext_catalog_files(locale_root, domain, languages)
            if files:
                units += _gettext_units("django", f"{name}:{domain}", files)
    return units


def allauth_units(languages: Iterable[str] = SUPPORTED_LANGUAGES) -> list[Unit]:
    """UI messages of django-allauth (account, social account, MFA and user-session pages)."""
    files = _gettext_catalog_files(_package_dir("allauth") / "locale", "django", languages)
    return _gettext_units("django-allauth", "django-allauth:django", files)


# --------------------------------------------------------------------------------------------
# pycountry (iso-codes)

# database file -> (JSON key, fields holding names, group prefix, code field(s), domain)
_PYCOUNTRY_DATABASES = {
    "iso3166-1": ("3166-1", ("name", "official_name", "common_name"), "territory",
                  ("alpha_2",), "country"),
    "iso3166-2": ("3166-2", ("name",), "subdivision", ("code",), "subdivision"),
    "iso639-3": ("639-3", ("name", "common_name", "inverted_name"), "language",
                 ("alpha_2", "alpha_3"), "language"),
    "iso4217": ("4217", ("name",), "currency", ("alpha_3",), "currency"),
    "iso15924": ("15924", ("name",), "script", ("alpha_4",), "script"),
}


def pycountry_units(languages: Iterable[str] = SUPPORTED_LANGUAGES) -> list[Unit]:
    """Names from the iso-codes databases with their translations.

    The catalogs' msgid is the English name, so every name field (``name``, ``official_name``,
    ``common_name``...) of a record becomes its own unit, grouped by the record's code: the
    grouping is what the paraphrase pairs (name vs. official name) are built from.
    """
    languages = tuple(languages)
    root = _package_dir("pycountry")
    units = []
    for domain_file, spec in _PYCOUNTRY_DATABASES.items():
        json_key, fields, prefix, code_fields, domain = spec
        database = root / "databases" / f"{domain_file}.json"
        records = json.loads(database.read_text("utf-8"))[json_key]
        lookup: dict[str, dict[str, str]] = {}
        for lang in languages:
            locale = _PYCOUNTRY_LOCALE.get(lang, lang)
            path = root / "locales" / locale / "LC_MESSAGES" / f"{domain_file}.mo"
            if lang == "en" or not path.is_file():
                continue
            for message in read_mo(path):
                if message.context is None and message.msgstr[0].strip():
                    lookup.setdefault(message.msgid, {})[lang] = message.msgstr[0]
        seen = set()
        for record in records:
            code = next(record[f] for f in code_fields if f in record)
            for field in fields:
                name = record.get(field)
                if not name or (code, name) in seen:
                    continue
                seen.add((code, name))
                units.append(Unit(
                    source="pycountry", catalog=f"pycountry:{domain_file}", key=f"{code}#{field}",
                    group=f"{prefix}:{code}", domain=domain, english=name,
                    translations=tuple(sorted(lookup.get(name, {}).items())),
                ))
    return units


# --------------------------------------------------------------------------------------------
# Unicode CLDR, as Babel ships it


def _resolved(value, aliases: bool):
    """Babel stores "same as that other field" as ``(Alias, value)`` in merged data."""
    if isinstance(value, tuple):
        return value[-1] if aliases else None
    return value


def _cldr_entries(data: dict, aliases: bool = False) -> Iterator[tuple[str, str, str, str, str]]:
    """Yield ``(category, key, group, domain, text)`` for the display names of one locale.

    With ``aliases`` a field that CLDR defines as an alias of another takes that one's value
    (wanted for English, whose stand-alone month names alias the format ones).
    """
    for code, text in data.get("territories", {}).items():
        domain = "country" if code.isalpha() else "region"
        yield "territories", code, f"territory:{code}", domain, text
    for code, text in data.get("languages", {}).items():
        yield "languages", code, f"language:{code}", "language", text
    for code, text in data.get("scripts", {}).items():
        yield "scripts", code, f"script:{code}", "script", text
    for code, text in data.get("currency_names", {}).items():
        yield "currency_names", code, f"currency:{code}", "currency", text
    for zone, names in data.get("meta_zones", {}).items():
        for kind in ("generic", "standard", "daylight"):
            text = names.get("long", {}).get(kind)
            if text:
                yield "meta_zones", f"{zone}/{kind}", f"metazone:{zone}", "timezone", text
    for zone, names in data.get("time_zones", {}).items():
        if names.get("city"):
            yield "time_zones", f"{zone}/city", f"city:{zone}", "city", names["city"]
        for kind in ("generic", "standard", "daylight"):
            text = names.get("long", {}).get(kind)
            if text:
                yield "time_zones", f"{zone}/{kind}", f"zone:{zone}", "timezone", text
    for unit, names in data.get("unit_display_names", {}).items():
        if isinstance(names, dict) and names.get("long"):
            yield "unit_display_names", unit, f"unit:{unit}", "unit", names["long"]
    for category in ("months", "days"):
        for context in ("stand-alone", "format"):
            names = _resolved(data.get(category, {}).get(context, {}).get("wide"), aliases) or {}
            for number, text in names.items():
                yield category, f"{context}/{number}", f"{category}:{number}", "calendar", text


def cldr_units(languages: Iterable[str] = SUPPORTED_LANGUAGES) -> list[Unit]:
    """Display names of the CLDR data in Babel, English from the ``en`` locale.

    Each language's own data is read without inheritance (``merge_inherited=False``), so a
    name the locale does not translate is missing instead of copied from the root locale.
    """
    _package_dir("babel")  # a named error, not an ImportError, when the demo extra is missing
    from babel import localedata

    languages = tuple(languages)
    english = {(category, key): (group, domain, text) for category, key, group, domain, text
               in _cldr_entries(localedata.load("en"), aliases=True)}
    translations: dict[tuple[str, str], dict[str, str]] = {}
    for lang in languages:
        locale = _CLDR_LOCALE.get(lang, lang)
        if lang == "en" or not localedata.exists(locale):
            continue
        own = localedata.load(locale, merge_inherited=False)
        for category, key, _group, _domain, text in _cldr_entries(own):
            if (category, key) in english and isinstance(text, str) and text.strip():
                translations.setdefault((category, key), {})[lang] = text
    units = []
    for (category, key), (group, domain, text) in english.items():
        if not isinstance(text, str) or not text.strip():
            continue
        units.append(Unit(
            source="cldr", catalog=f"cldr:{category}", key=key, group=group, domain=domain,
            english=text, translations=tuple(sorted(translations.get((category, key), {}).items())),
        ))
    return units


# --------------------------------------------------------------------------------------------

#: The sources of :func:`all_units`, by preference (each maps languages to its units).
UNIT_SOURCES = (cldr_units, pycountry_units, django_units, allauth_units)


def all_units(languages: Iterable[str] = SUPPORTED_LANGUAGES) -> list[Unit]:
    """Every unit of every source, in a fixed order (sources by preference, then file order).

    The order matters: where two units give different translations of one English text, the
    earlier unit's translation is the one aligned products use.
    """
    languages = tuple(languages)
    return [unit for source in UNIT_SOURCES for unit in source(languages)]


def package_version(package: str) -> str:
    """The installed version of a distribution, or ``"not installed"``."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


# --------------------------------------------------------------------------------------------
# Debian's gettext catalogs (``builtin:debian``: the human translations of installed packages)

#: Where Debian installs compiled gettext catalogs: ``<root>/<locale>/LC_MESSAGES/<domain>.mo``.
DEBIAN_LOCALE_ROOT = Path("/usr/share/locale")
_DEBIAN_LOCALE = {"zh": "zh_CN"}

#: The Debian packages whose catalogs ``builtin:debian`` reads, with their domains and the
#: licence their ``/usr/share/doc/<package>/copyright`` gives for the package (the translations
#: are distributed under it). User-interface and error messages of base system tools and of
#: GLib / GTK, translated by the Translation Project's and GNOME's teams. iso-codes is left out:
#: pycountry already reads it.
DEBIAN_CATALOGS: tuple[dict, ...] = (
    {"package": "coreutils", "domains": ("coreutils",), "licence": "GPL-3+"},
    {"package": "tar", "domains": ("tar",), "licence": "GPL-3+"},
    {"package": "grep", "domains": ("grep",), "licence": "GPL-3+"},
    {"package": "sed", "domains": ("sed",), "licence": "GPL-3+"},
    {"package": "findutils", "domains": ("findutils",), "licence": "GPL-3+"},
    {"package": "diffutils", "domains": ("diffutils",), "licence": "GPL-3+"},
    {"package": "bash", "domains": ("bash",), "licence": "GPL-3+"},
    {"package": "make", "domains": ("make",), "licence": "GPL-3+"},
    {"package": "wget", "domains": ("wget",), "licence": "GPL-3+"},
    {"package": "apt", "domains": ("apt",), "licence": "GPL-2+"},
    {"package": "dpkg", "domains": ("dpkg",), "licence": "GPL-2+"},
    {"package": "adduser", "domains": ("adduser",), "licence": "GPL-2+"},
    {"package": "man-db", "domains": ("man-db",), "licence": "GPL-2+"},
    {"package": "procps", "domains": ("procps-ng",), "licence": "GPL-2.0+ / LGPL-2.1+"},
    {"package": "systemd", "domains": ("systemd",), "licence": "LGPL-2.1+"},
    {"package": "libpam-runtime", "domains": ("Linux-PAM",), "licence": "BSD-3-clause or GPL"},
    {"package": "libglib2.0-data", "domains": ("glib20",), "licence": "LGPL-2.1+"},
    {"package": "libgtk-3-common", "domains": ("gtk30", "gtk30-properties"), "licence": "LGPL-2+"},
    {"package": "xkb-data", "domains": ("xkeyboard-config",), "licence": "MIT-style (xkeyboard-config)"},
    {"package": "xdg-user-dirs", "domains": ("xdg-user-dirs",), "licence": "GPL-2+"},
    {"package": "shared-mime-info", "domains": ("shared-mime-info",), "licence": "GPL-2+"},
)

# GTK's mnemonic markers (keyboard shortcuts, not text): "打开(_O)", "Файл (_F)", "_Open".
_MNEMONIC_SUFFIX = re.compile(r"\s*\(_\w\)")
_MNEMONIC_PREFIX = re.compile(r"(?<!\w)_(?=\w)")


def _drop_mnemonics(text: str) -> str:
    return _MNEMONIC_PREFIX.sub("", _MNEMONIC_SUFFIX.sub("", text)).strip()


def debian_catalog_files(languages: Iterable[str], root: str | Path | None = None
                         ) -> dict[tuple[str, str], dict[str, Path]]:
    """``{(package, domain): {lang: .mo path}}`` for the catalogs of :data:`DEBIAN_CATALOGS`
    that exist under ``root`` (default :data:`DEBIAN_LOCALE_ROOT`) in at least one of
    ``languages`` (English excluded)."""
    root = Path(DEBIAN_LOCALE_ROOT if root is None else root)
    languages = tuple(languages)
    found = {}
    for entry in DEBIAN_CATALOGS:
        for domain in entry["domains"]:
            files = _gettext_catalog_files(root, domain, languages, _DEBIAN_LOCALE)
            if files:
                found[entry["package"], domain] = files
    return found


def debian_units(languages: Iterable[str] = SUPPORTED_LANGUAGES,
                 root: str | Path | None = None) -> list[Unit]:
    """The messages of Debian's catalogs (:data:`DEBIAN_CATALOGS`) under ``root``, one unit per
    message. Messages with a line break or a tab (help screens, tables) are left out, and GTK's
    mnemonic markers are dropped from both sides; the rest is :func:`_gettext_units`' merge."""
    units = []
    for (package, domain), files in sorted(debian_catalog_files(tuple(languages), root).items()):
        for unit in _gettext_units("debian", f"debian:{package}/{domain}", files):
            texts = [unit.english, *(text for _lang, text in unit.translations)]
            if any("\n" in text or "\t" in text for text in texts):
                continue
            units.append(replace(
                unit, english=_drop_mnemonics(unit.english),
                translations=tuple((lang, _drop_mnemonics(text)) for lang, text in unit.translations),
                variants=tuple((lang, _drop_mnemonics(text)) for lang, text in unit.variants),
            ))
    return units


def debian_versions(packages: Iterable[str]) -> dict[str, str]:
    """``{package: installed version}`` from dpkg ("not installed" or "unknown" otherwise)."""
    import shutil
    import subprocess

    versions = {}
    query = shutil.which("dpkg-query")
    for package in packages:
        if query is None:
            versions[package] = "unknown (no dpkg-query)"
            continue
        result = subprocess.run([query, "-W", "-f=${Version}", package], capture_output=True, text=True)
        versions[package] = result.stdout.strip() if result.returncode == 0 and result.stdout.strip() \
            else "not installed"
    return versions
