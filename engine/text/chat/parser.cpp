// Recursive-descent parser following jinja2/parser.py's grammar and operator
// precedence (or < and < not < compare < + - < ~ < * / // % < ** < unary <
// postfix/filters/tests).
#include "engine/text/chat/parser.h"

#include <cstdlib>

#include "configs/error.h"
#include "engine/text/chat/builtins.h"
#include "engine/text/chat/lexer.h"

namespace hmoe::chat {
namespace {

constexpr int kMaxNesting = 256;      // expression and block nesting
constexpr int kMaxTagNodes = 4096;    // syntax nodes in one {{ }} or {% %}: bounds tree depth
                                      // (long filter/operator chains nest to the left)

class Parser {
 public:
  explicit Parser(std::vector<Token> toks) : t_(std::move(toks)) {}

  Body parse_all() {
    Body body = parse_body({});
    if (peek().kind != Tok::eof) fail("unexpected tag");
    return body;
  }

 private:
  const Token& peek(size_t k = 0) const { return t_[std::min(p_ + k, t_.size() - 1)]; }
  const Token& next() {
    const Token& t = t_[p_];
    if (p_ + 1 < t_.size()) ++p_;
    return t;
  }
  bool is_op(const char* op, size_t k = 0) const { return peek(k).kind == Tok::op && peek(k).value == op; }
  bool is_name(const char* n, size_t k = 0) const { return peek(k).kind == Tok::name && peek(k).value == n; }
  bool accept_op(const char* op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool accept_name(const char* n) {
    if (!is_name(n)) return false;
    next();
    return true;
  }

  static std::string describe(const Token& t) {
    switch (t.kind) {
      case Tok::text: return "text";
      case Tok::var_begin: return "'{{'";
      case Tok::var_end: return "'}}'";
      case Tok::block_begin: return "'{%'";
      case Tok::block_end: return "'%}'";
      case Tok::eof: return "end of template";
      case Tok::string: return "string literal";
      default: return "'" + t.value + "'";
    }
  }

  [[noreturn]] void fail(const std::string& what) const {
    const Token& t = peek();
    std::string msg = "chat template " + std::to_string(t.line) + ":" + std::to_string(t.col) +
                      ": " + what + " at " + describe(t);
    if (!construct_.empty()) msg += " (in '" + construct_ + "')";
    throw Error(ErrorKind::bad_model, msg);
  }

  void expect_op(const char* op) {
    if (!accept_op(op)) fail(std::string("expected '") + op + "'");
  }
  std::string expect_name() {
    if (peek().kind != Tok::name) fail("expected a name");
    return next().value;
  }
  void expect_block_end() {
    if (peek().kind != Tok::block_end) fail("expected '%}'");
    next();
  }

  struct Depth {
    Parser& p;
    explicit Depth(Parser& pp) : p(pp) {
      if (++p.depth_ > kMaxNesting) p.fail("template nested too deeply");
    }
    ~Depth() { --p.depth_; }
  };

  // ---- statements ----------------------------------------------------------

  // Parses until one of `ends` appears as a block tag name (left unconsumed:
  // p_ then points at that name, after '{%').
  Body parse_body(std::initializer_list<const char*> ends) {
    Depth guard(*this);
    Body body;
    while (true) {
      const Token& t = peek();
      if (t.kind == Tok::eof) {
        if (ends.size() != 0) fail(std::string("missing '{% ") + *ends.begin() + " %}'");
        return body;
      }
      if (t.kind == Tok::text) {
        auto n = node(NodeKind::text);
        n->text = next().value;
        body.push_back(std::move(n));
      } else if (t.kind == Tok::var_begin) {
        next();
        tag_nodes_ = 0;
        auto n = node(NodeKind::output);
        construct_ = "{{ ... }}";
        n->expr = parse_tuple(true);
        if (peek().kind != Tok::var_end) fail("expected '}}'");
        next();
        construct_.clear();
        body.push_back(std::move(n));
      } else if (t.kind == Tok::block_begin) {
        const Token& kw = peek(1);
        if (kw.kind == Tok::name)
          for (const char* e : ends)
            if (kw.value == e) {
              next();
              return body;
            }
        next();
        tag_nodes_ = 0;
        body.push_back(parse_statement());
      } else {
        fail("unexpected token");
      }
    }
  }

  NodePtr node(NodeKind k) {
    auto n = std::make_unique<Node>();
    n->kind = k;
    n->line = peek().line;
    return n;
  }

  void end_tag(const char* name) {
    // p_ at the end keyword
    if (!accept_name(name)) fail(std::string("expected '") + name + "'");
    expect_block_end();
  }

  NodePtr parse_statement() {
    if (peek().kind != Tok::name) fail("expected a statement name after '{%'");
    std::string kw = peek().value;
    std::string saved = construct_;
    construct_ = "{% " + kw + " %}";
    NodePtr n;
    if (kw == "if") n = parse_if();
    else if (kw == "for") n = parse_for();
    else if (kw == "set") n = parse_set();
    else if (kw == "macro") n = parse_macro();
    else if (kw == "call") n = parse_call_block();
    else if (kw == "filter") n = parse_filter_block();
    else if (kw == "with") n = parse_with();
    else if (kw == "generation") {
      next();
      expect_block_end();
      n = node(NodeKind::scope);
      n->body = parse_body({"endgeneration"});
      end_tag("endgeneration");
    } else if (kw == "break" || kw == "continue") {
      if (loop_depth_ == 0) fail("'" + kw + "' outside a loop");
      n = node(kw == "break" ? NodeKind::break_ : NodeKind::continue_);
      next();
      expect_block_end();
    } else {
      fail("unknown or unsupported statement '" + kw + "'");
    }
    construct_ = saved;
    return n;
  }

  NodePtr parse_if() {
    auto n = node(NodeKind::if_);
    next();
    while (true) {
      ExprPtr cond = parse_tuple(true);
      expect_block_end();
      Body b = parse_body({"elif", "else", "endif"});
      n->branches.emplace_back(std::move(cond), std::move(b));
      if (accept_name("elif")) continue;
      if (accept_name("else")) {
        expect_block_end();
        n->else_body = parse_body({"endif"});
      }
      end_tag("endif");
      return n;
    }
  }

  void parse_targets(std::vector<std::string>& out) {
    bool paren = accept_op("(");
    do {
      out.push_back(expect_name());
    } while (accept_op(","));
    if (paren) expect_op(")");
  }

  NodePtr parse_for() {
    auto n = node(NodeKind::for_);
    next();
    parse_targets(n->targets);
    if (!accept_name("in")) fail("expected 'in'");
    n->expr = parse_or();
    if (accept_name("if")) n->filter = parse_expression();
    if (accept_name("recursive")) n->recursive = true;
    expect_block_end();
    ++loop_depth_;
    n->body = parse_body({"else", "endfor"});
    --loop_depth_;
    if (accept_name("else")) {
      expect_block_end();
      n->else_body = parse_body({"endfor"});
    }
    end_tag("endfor");
    return n;
  }

  NodePtr parse_set() {
    auto n = node(NodeKind::set);
    next();
    std::string first = expect_name();
    if (accept_op(".")) {
      n->targets.push_back(first);
      n->attr = expect_name();
    } else {
      n->targets.push_back(first);
      while (accept_op(",")) n->targets.push_back(expect_name());
    }
    if (accept_op("=")) {
      n->expr = parse_tuple(true);
      expect_block_end();
      return n;
    }
    if (!n->attr.empty() || n->targets.size() != 1) fail("expected '='");
    n->kind = NodeKind::set_block;
    if (accept_op("|")) n->filter = parse_filter_chain(nullptr);
    expect_block_end();
    n->body = parse_body({"endset"});
    end_tag("endset");
    return n;
  }

  void parse_params(std::vector<std::pair<std::string, ExprPtr>>& params) {
    expect_op("(");
    while (!is_op(")")) {
      if (!params.empty()) expect_op(",");
      if (is_op(")")) break;
      std::string name = expect_name();
      ExprPtr def;
      if (accept_op("=")) def = parse_expression();
      params.emplace_back(std::move(name), std::move(def));
    }
    expect_op(")");
  }

  NodePtr parse_macro() {
    auto n = node(NodeKind::macro);
    next();
    n->text = expect_name();
    parse_params(n->params);
    expect_block_end();
    int saved = loop_depth_;
    loop_depth_ = 0;
    n->body = parse_body({"endmacro"});
    loop_depth_ = saved;
    end_tag("endmacro");
    return n;
  }

  NodePtr parse_call_block() {
    auto n = node(NodeKind::call_block);
    next();
    if (is_op("(")) parse_params(n->params);
    n->expr = parse_expression();
    if (n->expr->kind != ExprKind::call) fail("expected a call");
    expect_block_end();
    n->body = parse_body({"endcall"});
    end_tag("endcall");
    return n;
  }

  NodePtr parse_filter_block() {
    auto n = node(NodeKind::filter_block);
    next();
    n->filter = parse_filter_chain(nullptr);
    expect_block_end();
    n->body = parse_body({"endfilter"});
    end_tag("endfilter");
    return n;
  }

  NodePtr parse_with() {
    auto n = node(NodeKind::scope);
    n->new_scope = true;
    next();
    while (peek().kind != Tok::block_end) {
      if (!n->params.empty()) expect_op(",");
      std::string name = expect_name();
      expect_op("=");
      n->params.emplace_back(std::move(name), parse_expression());
    }
    expect_block_end();
    n->body = parse_body({"endwith"});
    end_tag("endwith");
    return n;
  }

  // ---- expressions ---------------------------------------------------------

  ExprPtr make(ExprKind k, int line) {
    if (++tag_nodes_ > kMaxTagNodes) fail("expression too large");
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = line;
    return e;
  }

  ExprPtr parse_tuple(bool condexpr) {
    int line = peek().line;
    ExprPtr first = condexpr ? parse_expression() : parse_or();
    if (!is_op(",")) return first;
    auto t = make(ExprKind::tuple, line);
    t->args.push_back(std::move(first));
    while (accept_op(",")) {
      if (peek().kind == Tok::block_end || peek().kind == Tok::var_end || is_op(")")) break;
      t->args.push_back(condexpr ? parse_expression() : parse_or());
    }
    return t;
  }

  ExprPtr parse_expression() {
    Depth guard(*this);
    int line = peek().line;
    ExprPtr e = parse_or();
    while (accept_name("if")) {
      auto c = make(ExprKind::cond, line);
      c->args.push_back(parse_or());
      c->args.push_back(std::move(e));
      c->args.push_back(accept_name("else") ? parse_expression() : nullptr);
      e = std::move(c);
    }
    return e;
  }

  ExprPtr binary(const std::string& op, ExprPtr a, ExprPtr b, int line) {
    auto e = make(ExprKind::binary, line);
    e->name = op;
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }

  ExprPtr parse_or() {
    int line = peek().line;
    ExprPtr e = parse_and();
    while (accept_name("or")) e = binary("or", std::move(e), parse_and(), line);
    return e;
  }
  ExprPtr parse_and() {
    int line = peek().line;
    ExprPtr e = parse_not();
    while (accept_name("and")) e = binary("and", std::move(e), parse_not(), line);
    return e;
  }
  ExprPtr parse_not() {
    Depth guard(*this);
    int line = peek().line;
    if (accept_name("not")) {
      auto e = make(ExprKind::unary, line);
      e->name = "not";
      e->args.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
    int line = peek().line;
    ExprPtr e = parse_math1();
    ExprPtr cmp;
    while (true) {
      std::string op;
      static const char* ops[] = {"==", "!=", "<", "<=", ">", ">="};
      for (const char* o : ops)
        if (is_op(o)) op = o;
      if (!op.empty()) {
        next();
      } else if (is_name("in")) {
        next();
        op = "in";
      } else if (is_name("not") && is_name("in", 1)) {
        next();
        next();
        op = "notin";
      } else {
        break;
      }
      if (!cmp) {
        cmp = make(ExprKind::compare, line);
        cmp->args.push_back(std::move(e));
      }
      cmp->ops.push_back(op);
      cmp->args.push_back(parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(e);
  }
  ExprPtr parse_math1() {
    int line = peek().line;
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      std::string op = next().value;
      e = binary(op, std::move(e), parse_concat(), line);
    }
    return e;
  }
  ExprPtr parse_concat() {
    int line = peek().line;
    ExprPtr e = parse_math2();
    while (accept_op("~")) e = binary("~", std::move(e), parse_math2(), line);
    return e;
  }
  ExprPtr parse_math2() {
    int line = peek().line;
    ExprPtr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      std::string op = next().value;
      e = binary(op, std::move(e), parse_pow(), line);
    }
    return e;
  }
  ExprPtr parse_pow() {
    int line = peek().line;
    ExprPtr e = parse_unary(true);
    while (accept_op("**")) e = binary("**", std::move(e), parse_unary(true), line);
    return e;
  }
  ExprPtr parse_unary(bool with_filter) {
    Depth guard(*this);
    int line = peek().line;
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      e = make(ExprKind::unary, line);
      e->name = next().value;
      e->args.push_back(parse_unary(false));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    Depth guard(*this);
    const Token& t = peek();
    int line = t.line;
    if (t.kind == Tok::name) {
      std::string v = next().value;
      auto e = make(ExprKind::literal, line);
      if (v == "true" || v == "True") e->literal = Value::boolean(true);
      else if (v == "false" || v == "False") e->literal = Value::boolean(false);
      else if (v == "none" || v == "None") e->literal = Value::none();
      else {
        e->kind = ExprKind::name;
        e->name = v;
      }
      return e;
    }
    if (t.kind == Tok::string) {
      std::string s;
      while (peek().kind == Tok::string) s += next().value;
      auto e = make(ExprKind::literal, line);
      e->literal = Value::string(std::move(s));
      return e;
    }
    if (t.kind == Tok::integer) {
      auto e = make(ExprKind::literal, line);
      const std::string& v = next().value;
      errno = 0;
      long long x = std::strtoll(v.c_str(), nullptr, 10);
      e->literal = errno == ERANGE ? Value::real(std::strtod(v.c_str(), nullptr)) : Value::integer(x);
      return e;
    }
    if (t.kind == Tok::real) {
      auto e = make(ExprKind::literal, line);
      e->literal = Value::real(std::strtod(next().value.c_str(), nullptr));
      return e;
    }
    if (accept_op("(")) {
      if (accept_op(")")) return make(ExprKind::tuple, line);
      ExprPtr e = parse_tuple(true);
      if (e->kind == ExprKind::tuple) {
        expect_op(")");
        return e;
      }
      expect_op(")");
      return e;
    }
    if (accept_op("[")) {
      auto e = make(ExprKind::list, line);
      while (!is_op("]")) {
        if (!e->args.empty()) expect_op(",");
        if (is_op("]")) break;
        e->args.push_back(parse_expression());
      }
      expect_op("]");
      return e;
    }
    if (accept_op("{")) {
      auto e = make(ExprKind::dict, line);
      while (!is_op("}")) {
        if (!e->args.empty()) expect_op(",");
        if (is_op("}")) break;
        e->args.push_back(parse_expression());
        expect_op(":");
        e->args.push_back(parse_expression());
      }
      expect_op("}");
      return e;
    }
    fail("expected an expression");
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      int line = peek().line;
      if (accept_op(".")) {
        auto a = make(ExprKind::attr, line);
        if (peek().kind == Tok::integer) {
          a->kind = ExprKind::item;
          auto idx = make(ExprKind::literal, line);
          idx->literal = Value::integer(std::strtoll(next().value.c_str(), nullptr, 10));
          a->args.push_back(std::move(e));
          a->args.push_back(std::move(idx));
        } else {
          a->name = expect_name();
          a->args.push_back(std::move(e));
        }
        e = std::move(a);
      } else if (accept_op("[")) {
        e = parse_subscript(std::move(e), line);
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr target, int line) {
    ExprPtr parts[3];
    bool is_slice = false;
    for (int k = 0; k < 3; ++k) {
      if (!is_op(":") && !is_op("]")) parts[k] = parse_expression();
      if (k < 2 && accept_op(":")) {
        is_slice = true;
        continue;
      }
      break;
    }
    expect_op("]");
    auto e = make(is_slice ? ExprKind::slice : ExprKind::item, line);
    e->args.push_back(std::move(target));
    if (!is_slice) {
      if (!parts[0]) fail("expected a subscript");
      e->args.push_back(std::move(parts[0]));
    } else {
      for (auto& p : parts) e->args.push_back(std::move(p));
    }
    return e;
  }

  void parse_args(Expr& e) {
    expect_op("(");
    bool first = true;
    while (!is_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (is_op(")")) break;
      if (peek().kind == Tok::name && is_op("=", 1)) {
        std::string k = next().value;
        next();
        e.kwargs.emplace_back(std::move(k), parse_expression());
      } else {
        if (!e.kwargs.empty()) fail("positional argument after keyword argument");
        e.args.push_back(parse_expression());
      }
    }
    expect_op(")");
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto e = make(ExprKind::call, peek().line);
    e->args.push_back(std::move(callee));
    parse_args(*e);
    return e;
  }

  void check_filter(const std::string& name) {
    if (!known_filter(name)) fail("no filter named '" + name + "'");
  }

  ExprPtr parse_filter_chain(ExprPtr operand) {
    ExprPtr e = std::move(operand);
    do {
      int line = peek().line;
      auto f = make(ExprKind::filter, line);
      f->name = expect_name();
      while (accept_op(".")) f->name += "." + expect_name();
      check_filter(f->name);
      f->args.push_back(std::move(e));
      if (is_op("(")) parse_args(*f);
      e = std::move(f);
    } while (accept_op("|"));
    return e;
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    while (true) {
      if (accept_op("|")) {
        int line = peek().line;
        auto f = make(ExprKind::filter, line);
        f->name = expect_name();
        check_filter(f->name);
        f->args.push_back(std::move(e));
        if (is_op("(")) parse_args(*f);
        e = std::move(f);
      } else if (is_name("is")) {
        int line = next().line;
        auto t = make(ExprKind::test, line);
        t->negated = accept_name("not");
        t->name = expect_name();
        while (accept_op(".")) t->name += "." + expect_name();
        if (!known_test(t->name)) fail("no test named '" + t->name + "'");
        t->args.push_back(std::move(e));
        if (is_op("(")) {
          parse_args(*t);
        } else if ((peek().kind == Tok::name || peek().kind == Tok::string || peek().kind == Tok::integer ||
                    peek().kind == Tok::real || is_op("[") || is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and") && !is_name("if") &&
                   !is_name("is") && !is_name("in") && !is_name("not")) {
          ExprPtr arg = parse_postfix(parse_primary());
          t->args.push_back(std::move(arg));
        }
        e = std::move(t);
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  std::vector<Token> t_;
  size_t p_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
  int tag_nodes_ = 0;
  std::string construct_;
};

}  // namespace

Body parse_template(const std::string& source) { return Parser(lex(source)).parse_all(); }

}  // namespace hmoe::chat
