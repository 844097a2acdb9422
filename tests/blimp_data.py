"""Hand-checked BLiMP pairs from each paradigm's file, and a data folder made of them (for the BLiMP tests and the
BLiMP training test)."""

from __future__ import annotations

import json
from pathlib import Path

from normx.data import blimp as ev

# hand-checked pairs from each paradigm's file (pairID in the comment): (good, bad, target, foil, evidence)
HAND_CHECKED = {
    "ana": [
        ("Susan revealed herself.", "Susan revealed themselves.", "herself", "themselves", "Susan"),  # 0
        ("These patients do respect themselves.", "These patients do respect himself.", "themselves", "himself",
         "patients"),  # 2
        ("Senators might talk about themselves.", "Senators might talk about itself.", "themselves", "itself",
         "Senators"),  # 779
        ("A lot of senators watched themselves.", "A lot of senators watched herself.", "themselves", "herself",
         "senators"),  # 618
        ("The Impressionists like themselves.", "The Impressionists like himself.", "themselves", "himself",
         "Impressionists"),  # 202: "like" is the verb here, not a preposition
        ("Harvard University shocks itself.", "Harvard University shocks themselves.", "itself", "themselves",
         "University"),  # 258
    ],
    "dna": [
        ("Raymond is selling this sketch.", "Raymond is selling this sketches.", "sketch", "sketches", "this"),  # 0
        ("Craig explored that grocery store.", "Craig explored that grocery stores.", "store", "stores", "that"),  # 1
        ("Eva has scared these children.", "Eva has scared these child.", "children", "child", "these"),  # 2
        ("A lot of girls examined those essays.", "A lot of girls examined those essay.", "essays", "essay",
         "those"),  # 483
    ],
    "dnaa": [
        ("Rebecca was criticizing those good documentaries.", "Rebecca was criticizing those good documentary.",
         "documentaries", "documentary", "those"),  # 0
        ("All banks distract these out in the open adults.", "All banks distract these out in the open adult.",
         "adults", "adult", "these"),  # 137: "the" inside the adjective is not the evidence
        ("This window hasn't astounded that lost dancer.", "This window hasn't astounded that lost dancers.",
         "dancer", "dancers", "that"),  # 779
    ],
    "dna_2": [  # the determiner changes; the evidence is the noun after it
        ("Some dog stunned this committee.", "Some dog stunned these committee.", "this", "these", "committee"),  # 0
        ("Tracy passed these art galleries.", "Tracy passed this art galleries.", "these", "this", "galleries"),  # 1
        ("Samuel would conceal those chairs.", "Samuel would conceal that chairs.", "those", "that", "chairs"),  # 500
    ],
    "dnaa_2": [
        ("Cynthia scans these hard books.", "Cynthia scans this hard books.", "these", "this", "books"),  # 0
        ("Donna might hire this serious actress.", "Donna might hire these serious actress.", "this", "these",
         "actress"),  # 1
        ("Erin isn't criticizing this purple book.", "Erin isn't criticizing these purple book.", "this", "these",
         "book"),  # 500
    ],
    "darn": [
        ("A niece of most senators hasn't descended most slopes.",
         "A niece of most senators haven't descended most slopes.", "hasn't", "haven't", "niece"),  # 0
        ("A newspaper article about the Borgias has disagreed with Marcus.",
         "A newspaper article about the Borgias have disagreed with Marcus.", "has", "have", "article"),  # 2
        ("A cousin of a lot of dancers anticipates Naomi to aggravate Angela.",
         "A cousin of a lot of dancers anticipate Naomi to aggravate Angela.", "anticipates", "anticipate",
         "cousin"),  # 6
    ],
    "rpsv": [
        ("Paula references Robert.", "Paula reference Robert.", "references", "reference", "Paula"),  # 0
        ("Most legislatures haven't disliked children.", "Most legislatures hasn't disliked children.", "haven't",
         "hasn't", "legislatures"),  # 1
        ("A lot of cashiers impress Lawrence.", "A lot of cashiers impresses Lawrence.", "impress", "impresses",
         "cashiers"),  # 821
    ],
    "ipsv": [
        ("Those radii have scared that teenager.", "Those radii has scared that teenager.", "have", "has",
         "radii"),  # 0
        ("This goose isn't bothering Edward.", "This goose weren't bothering Edward.", "isn't", "weren't",
         "goose"),  # 1
        ("A lot of alumni aren't stunning Craig.", "A lot of alumni isn't stunning Craig.", "aren't", "isn't",
         "alumni"),  # 192
    ],
}


def write_data(folder: Path) -> Path:
    """A data folder with a few hand-checked BLiMP lines per paradigm (written in the test's temp folder)."""
    (folder / "blimp").mkdir(parents=True)
    for key, rows in HAND_CHECKED.items():
        lines = [json.dumps({"sentence_good": g, "sentence_bad": b, "pairID": str(i)}) for i, (g, b, *_) in
                 enumerate(rows)]
        (folder / "blimp" / f"{ev.PARADIGMS[key].uid}.jsonl").write_text("\n".join(lines) + "\n")
    return folder
