"""Coined names for the synthetic world: pronounceable, syllable-based, and none inside another."""

from __future__ import annotations

import random

# Syllable inventory. Onsets and vowels are chosen to read easily in English while
# rarely producing real words; a short blocklist catches the few real names they can make.
_ONSETS = (
    "b", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z",
    "br", "dr", "gr", "kr", "tr", "th", "st", "sk", "sh", "vr", "ph",
)
_VOWELS = ("a", "e", "i", "o", "u", "a", "e", "o", "ae", "ei", "ou")
_CODAS = ("", "", "", "", "n", "r", "l", "s", "m", "n", "r", "l")
_SINGLE = ("b", "d", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z")

#: Word endings per use: they give each kind of name its own flavour.
ENDINGS = {
    "given_f": ("a", "ine", "ette", "ira", "elle", "ys", "wen", "ara", "ola", "essa", "ika"),
    "given_m": ("o", "an", "ek", "ar", "ius", "en", "or", "am", "ald", "ick", "eon"),
    "surname": ("ett", "ow", "ard", "ley", "ski", "mann", "ton", "ick", "well", "ridge", "vik", "sen", "ez", "ane"),
    "city": ("mora", "heim", "ford", "ovo", "ane", "eth", "port", "grad", "vale", "burg", "ika", "ay", "wick", "osa"),
    "country": ("ania", "ovia", "esh", "istan", "aria", "and", "ethia", "ory", "ia", "alia", "eny"),
    "place": ("ore", "ith", "amar", "ene", "ax", "ondo", "ule", "arra", "ion", "ex", "yre", "ost"),
}

#: Real words and names a coined word must not be: every whole-word token of a 49k-token LM
#: vocabulary and every IANA time-zone city that the syllable grammar above can form, and a
#: list of common given names, countries and cities written by hand.
BLOCKLIST = frozenset(
    """
    mimosa larissa vanessa odessa marisa melissa clarissa theresa nerissa
    aaron abigail aboard addison adela adeline adrian adriel aegean aiden akira akron albania
    alexander algeria algorith alice alien alkaline allan allen alley allison allow alloys
    almost amalia amelia amino amman ammonia analys andean andersen andorra andrew anemia angel
    angela angina angola angular annex anthony antio anton antonio archer arena argentina ariana
    arica arisen arjun arlene armen armenia armor aroma array arrays arrow arsen arthur asean
    asher ashton asian asmara asmera assays aston athens atlas aubrey audrey august aurora
    austin austria autumn avery avian azerbaijan bahamas bahrain baltimore bamboo banana
    bangladesh barbados barbara barley barren barrett barton baseline bavaria beard bedford
    belarus belem belgian belgium belize bella below benin benjamin bennett bentley bergen
    berkeley bermuda bernard bhutan biden billion biore bipolar bismarck board bogota boise
    bolivia bologna boost boris borneo borrow bosnia boston boulder bovine bradford bradley
    braga brandon brasov braxton brayden brazil bremen brest breton brian brody brooks brunei
    bruno bryson bulgaria bulimia burden burgas burma burrow burton burundi butte caleb calvin
    cambodia camden cameron camila campinas canada caracas carlo carlos caroline carson carter
    celia charles charlie chase chile china chloe christian claire clara colleen colombia colton
    congo connor cooper cordoba croatia cyprus czechia dallas dalton damian daniel dario darlene
    darren david dayton declan degrad delay delays delia delilah deline della demand demean
    denmark denver deport derby deton devon diane diego dinesh dismay divine divor dnipro dollar
    dominic dominica dominion donald donor dopamine doreen dothan dover dragan drama dream
    dresden driven dublin dudley durham dylan easton ebola ecuador edema edith eisen eleanor
    elena eleven eliana elias elijah ellen ellie elliot elliott emery emilia emiliano emily
    emmanuel emmett emory emperor england eritrea error essays essen estonia ethan evelyn
    everett everly fabio faisal faith fallen famine farewell fargo favor feline fellow feminine
    ferdinand finland follow foremost forgiven formula fourteen france fresno fusion gabon
    gabriel gabriella galati galax galvan galway gamma garden gasoline gavin genera geneva
    genius genoa genuine george georgia gerald german germany ghana gianna gilda giovanni given
    golden gonna goran grace graham grammar granular grayson greece greek green greene grenada
    greyson guard guyana hailey haiti halle hamburg hamid hamilton hannah hansen harald harden
    harper harrison harvard hassan havana haven hayden hazel heard helen helena hellen hello
    henry herald herman hermann hermene hernia heroine hilar hilda hipaa histamine hoard holiday
    holland hollow homeland honduras honor horror houston hudson human humane humor hungary
    hunter iceland imogen import index india indian indonesia indoor inland inline inuvik
    iquique ireland irvine isaac isabella isaiah islam island israel italy ivory jackson jacob
    jamaica james jameson japan jason jasper jaxson jayce jayden jeremiah jonah jonathan jordan
    joseph josephine joshua josiah judah julia julian justin kaiden kaito kampala kanton karen
    karim karma karter kathleen kayden kazan keith kemal kenji kennedy kenneth kenya kerala
    kevin kharkiv kilow kingston kinsley kiran kiribati korea korean kosovo kumar kursk kuwait
    laden landon laredo larva latino latvia lauren layla lebanon leeds legend leiden leonardo
    lesbian lesion lessen levine liberia lidia lillian lincoln linda lindeman linear linen
    lithuania logan logarith loren lorena lorenzo lorraine lowell lucas lunar luton luxembourg
    lydia macon maddox madeira madeline madelyn madison magadan mahesh maine mainz malachi
    malaga malaria malawi malay malays malaysia malta manaus mandela mania manila manor maracay
    marco marcus maria marian marietta marina marine marino mario marion marlene marrow martian
    martinez mason mateo matteo matthew maureen maverick maxwell medellin media median medina
    megan melan memor memory mendoza merida merriam mesoam metavar meteor mexico miami micah
    michael milan miles million milton minimax minor minsk miriam mirna mirror misman mobile
    modena modular module molar moldova monaco monday mongolia monkeys monrovia montana moore
    morgan morton mundane murray myles nabil nadia nanost naomi naples napoleon narrow natal
    natalia natalie nathan nathaniel nauru nazareth nebula nepal nervosa neuquen nevada newark
    nicholas nicolas niger nigeria nolan nonex noreen norman norton norway noumea obama ocala
    odessa ogden ohrid oliver olivia onboard onion online opera opinion orhan orion orlando
    ornith orwell oryol osaka overex padua paine paisley pakistan palau paleo palette panama
    panda panor paolo papua paraguay param paran paren paris parker parma pavel penelope penza
    perman persia persian persona peyton phenomen phobia phoen photon pietro pillar pillow pinsk
    pipeline piper piston pleven poland polar polio pollen poltava polys popular porto portugal
    powell provo qatar quinn quito racine radar radio radius raleigh ramadan raman ramesh rashid
    ratio raven reading recife regimen regina regular relax relay relays report retina reven
    rhett rijeka riley risen river rivera robert rohan roland roman romania romeo ronald roost
    rosalind rosario rosen rowan rowena russia russian rwanda ryder ryker rylee sadie salaam
    salam salem saline salisbury saliva salta salvador samantha samar samara samir samoa samuel
    santiago santos sarah sarajevo sarasota savannah savior savory sawyer scarlett scotland
    sebastian selena selim selma semen seminar sendai senior serbia serbian seren serena serene
    serenity seven sevilla shadow shallow shaman shampoo sharma sharon shear sheila shelley
    sherman shirley shiva shoreline siberia sibiu siena silas silva similar singular skeleton
    skopje skylar sliven slovakia slovenia sofia solar somalia someday sonar sophie soria sorrow
    souven spain split stamina standard stanford stanley stanton stays steam stefan stella
    stellar stereo steven stolen studio sudan sullivan summar sunday sundays suresh suriname
    surveys survivor susan sweden syria taboo talca tampa tanzania tarik tariq tasman tasmania
    teeth temuco teresa terra terror teruel tesla thailand thalia theodore theor theore theory
    thera thermost thiago thirteen thomas thousand timeline timor tirana tirane today tokyo
    toledo tolkien tomas tomsk tonga tornado torpedo tortola trays tremor trenton trillion
    trivia truman tubular tucker tudor tulsa tumor turin turkey turkeys tuvalu tyler uganda
    ukraine unbear unden undergrad uneven union unman unseen unwell ureth urine uruguay uterine
    vagina valencia valentina valley valleys valor vanuatu varna vasil vatican vegas vendor
    venez venezuela verona veteran vevay victoria video vietnam vikram villa vilnius vincent
    violet virginia vision vivian volgograd volley wales walker warren waylon wesley weston
    william willow wyatt xander xavier yemen zachary zadar zagreb zambia zelda zoran
    """.split()
)


class NameCoiner:
    """Coins words from syllables with one `random.Random`; every word it returns is new."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self._words: set[str] = set()  # used only for membership, never iterated

    def word(self, ending_kind: str, max_syllables: int = 2) -> str:
        """A fresh capitalised word: one or more syllables and an ending of the given kind."""
        endings = ENDINGS[ending_kind]
        rng = self.rng
        while True:
            n = 1 if max_syllables <= 1 else rng.choice((1, 1, 2))
            stem = rng.choice(_ONSETS + ("",)) + rng.choice(_VOWELS) + rng.choice(_CODAS)
            for _ in range(n - 1):
                stem += rng.choice(_SINGLE) + rng.choice(_VOWELS[:8])
            ending = rng.choice(endings)
            stem = _join(stem, ending, rng)
            w = stem.capitalize()
            low = w.lower()
            if len(low) < 5 or len(low) > 12 or low in BLOCKLIST or low in self._words:
                continue
            if _awkward(low):
                continue
            self._words.add(low)
            return w


def _ends_consonant(s: str) -> bool:
    return s[-1] not in "aeiouy"


def _join(stem: str, ending: str, rng: random.Random) -> str:
    """Join a stem and an ending without vowel pile-ups or long consonant clusters."""
    if not _ends_consonant(stem) and ending[0] in "aeiouy":
        return stem + rng.choice("lnrvdm") + ending
    if _ends_consonant(stem) and ending[0] not in "aeiouy":
        # keep at most two consonants across the join: drop the stem's coda
        while stem and _ends_consonant(stem):
            stem = stem[:-1]
        if not stem:
            return ending
    return stem + ending


def _awkward(w: str) -> bool:
    """Letter runs that read badly: three vowels or three consonants in a row, or a doubled
    first letter."""
    run_v = run_c = 0
    for ch in w:
        if ch in "aeiouy":
            run_v, run_c = run_v + 1, 0
        else:
            run_v, run_c = 0, run_c + 1
        if run_v >= 3 or run_c >= 3:
            return True
    return w[0] == w[1]


def nested_names(names: list[str]) -> list[int]:
    """Indices of names that contain another name of the list (case-insensitive substring),
    or repeat an earlier one.

    Checks every substring of each name whose length is that of some other name against the
    set of names: a few dozen set look-ups per name, fast for tens of thousands of names.
    """
    lows = [n.lower() for n in names]
    first: dict[str, int] = {}
    for i, n in enumerate(lows):
        first.setdefault(n, i)
    lengths = sorted({len(n) for n in lows})
    return [i for i, n in enumerate(lows) if first[n] != i or contains_shorter(n, first, lengths)]


def contains_shorter(low: str, names: "dict[str, int] | set[str]", lengths: list[int]) -> bool:
    """Whether a shorter member of `names` (lower-case; `lengths` their sorted lengths) occurs in `low`."""
    L = len(low)
    for ln in lengths:
        if ln >= L:
            return False
        for j in range(L - ln + 1):
            if low[j : j + ln] in names:
                return True
    return False
