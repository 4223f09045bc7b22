"""What each row of a user-data report measures, in a sentence or two, for the reader of report.html
who has not read docs/tutorial.md: what is compared with what, what a right answer is, and where the
data decides whether the row can exist at all (label-only data has no attributes to swap).

Rows are found by their key's family and kind (``figures.describe``); a kind added later without an
entry here is explained by its family's sentence.
"""

from __future__ import annotations

from collections.abc import Mapping

from training.evaluation.userdata.figures import Figure

FAMILY = {
    "zero-shot": "Each held-out photo is classified among all the dataset's labels by cosine with the label "
    "prompts, as POST /classify does; right when the top label is the photo's own.",
    "pair ranking": 'Two photos of different labels and a text true of them in one order ("The first image '
    'shows a shirt, while the second shows a coat."), shown in a random order: right when the model says '
    "which photo is the first. A model that ignores the text scores 0.5.",
    "hard negatives": "Each photo's caption against a caption one edit away that is false of it: right when "
    "the caption scores higher.",
    "caption over its negation, by text encoder": "The hard negatives' negation kind (the same photos, captions "
    "and negations) scored by pooled cosine with each text encoder of the version: right when the caption is "
    "closer to the photo than its negation.",
    "negation both ways, by phrasing (docs/negation.md)": "Each photo with a label it shows and one it does not, "
    "each asked in every negation phrasing of docs/negation.md: right when the caption beats its negation for the "
    "label shown and the negation beats the caption for the other; a scorer that only punishes negation words "
    "scores 0.5. Held-out phrasings are never trained on.",
    "paraphrase, by phrasing (docs/negation.md)": "Each label (and caption) said in every paraphrase phrasing of "
    'docs/negation.md ("a snapshot of a shirt."): right when the paraphrase is closer, through the text encoder, '
    "to its own plain caption (\"a shirt\") than to every other label's (and caption's); guessing scores 1 / their "
    "number. Held-out phrasings are never trained on.",
    "retrieval over a gallery (collections search)": "A gallery of held-out photos searched as a collection "
    "search ranks it (POST /collections/{name}/search): recall@k is the share of the right photos (those that "
    "satisfy the query) among the first k, out of as many as fit (precision@k where more than k are right); "
    "chance is what a random order scores on the same queries.",
    "2x2 items (Winoground-style)": "Two photos of different labels and their two captions. Text score: each photo "
    "prefers its own caption; image score: each caption prefers its own photo; group: both.",
}
KIND = {
    ("zero-shot", "confused"): "Only the photos of the classes the version's comparatives name (the pairs it "
    "confused on its calibration photos).",
    ("zero-shot", "comparatives"): "With the comparatives blended into the class embeddings (alpha 0.9, the "
    "request default): the change says whether they help on these photos.",
    ("pair ranking", "label"): "The texts name the two labels.",
    ("pair ranking", "attribute"): 'The texts name one attribute that differs (from labels.json): "The first '
    'image has long sleeves, while the second has short sleeves." A base model that never read such a '
    'sentence can score below 0.5: the words it matches ("long", "short") point to the wrong photo as often '
    "as not.",
    ("pair ranking", "records"): "Your own pair records of the evaluated split.",
    ("hard negatives", "all"): "Every kind below together.",
    ("hard negatives", "negation"): 'The negative adds or removes a negation ("a photo of a shirt." -> "no photo '
    'of a shirt.").',
    ("hard negatives", "label"): "The negative is another label's caption (labelled photos only).",
    ("hard negatives", "swap"): 'The negative trades the attribute words of two objects ("a red coat and a blue '
    'hat" -> "a blue coat and a red hat"). Only captions that name two objects with attribute words have one.',
    ("hard negatives", "relation"): 'The negative flips a relation word ("left of" -> "right of").',
    ("hard negatives", "user"): "Your own negatives (negatives records).",
    ("retrieval over a gallery (collections search)", "compositional"): "Two attributes of one item, without "
    'its name ("a photo of an item with long sleeves and a pointed collar."): right are the photos whose label '
    "declares both (labels.json; data without attributes has no such query).",
    ("retrieval over a gallery (collections search)", "negated"): "Every label in the negated form of every "
    'phrasing of docs/negation.md ("there is no shirt in this photo."): right are the photos of the other labels.',
    ("retrieval over a gallery (collections search)", "difference"): 'A gallery photo and "The first image shows '
    'a coat, while the second shows a shirt." (first: the wanted photo, second: the query): right are the '
    "gallery's coats; the query photo itself is left out. Both rankings order the 100 photos nearest the query.",
}
LABEL_ONLY = {
    ("hard negatives", "swap"): 'This data has labels only (captions "a photo of a {label}." name one object '
    "and no attribute words), so none of its captions has such a negative: the row holds only the compared "
    "version's figure, measured on data that had them, or is left out.",
    ("hard negatives", "relation"): "This data has labels only: its captions have no relation word to flip.",
}


def _kind(f: Figure) -> str:
    parts = f.key.split(".")
    if f.family == "zero-shot":
        return "comparatives" if parts[0] == "zeroshot_comparative" else "confused" if "confused" in parts[1] else ""
    if f.family == "pair ranking":
        return parts[1]
    if f.family == "hard negatives":
        return parts[2]
    if parts[0] == "retrieval":
        return parts[1]
    return ""


def explanation(f: Figure, label_only: bool = False) -> str:
    """What the row of ``f`` measures; ``label_only``: the data has no caption records."""
    kind = (f.family, _kind(f))
    parts = [FAMILY.get(f.family, "")]
    if kind == ("zero-shot", "comparatives") and "confused" in f.key:
        parts.append(KIND[("zero-shot", "confused")])
    parts.append(KIND.get(kind, ""))
    if label_only:
        parts.append(LABEL_ONLY.get(kind, ""))
    if f.replaces is not None:
        parts.append(f"The change is this row minus the same measurement with the {f.versus} ({f.replaces}).")
    return " ".join(p for p in parts if p) or f"The figure {f.key} of eval.json."


def explanations(rows: list[Figure], section: Mapping[str, object]) -> list[tuple[str, str]]:
    """(row name, what it measures) for every row of a dataset's table, in the table's order."""
    skipped = section.get("skipped")
    label_only = isinstance(skipped, Mapping) and "captions" in skipped
    return [(f.name, explanation(f, label_only)) for f in rows]
